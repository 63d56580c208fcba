"""``lanes worker``: run one fleet's Celery worker, sized from its pool's width."""

from __future__ import annotations

import os
import sys

import click

from lanes.catalog import load_routing, open_catalog
from lanes.celery_client import HOSTED_FLEET
from lanes.cli.common import emit_json, emit_table, json_option, pass_settings
from lanes.errors import InvalidInput


def _fleets(settings) -> list[str]:
    table = load_routing(open_catalog(settings, create=False))
    return sorted({route.fleet or HOSTED_FLEET for route in table.workflows.values() if route.candidates})


@click.command(name="worker")
@click.option("--fleet", help="The fleet (primary pool name, or 'hosted') whose work to run.")
@click.option("--list", "list_fleets", is_flag=True, help="List the fleets of the catalog and exit.")
@click.option("--loglevel", default="WARNING", show_default=True)
@json_option
@pass_settings
def command(settings, fleet, list_fleets, loglevel, as_json) -> None:
    """Run the worker of one fleet until stopped (SIGTERM or Ctrl-C).

    The worker runs width x workers-per-lane threads, keeps one of them free of
    background work, and restarts gracefully when the catalog changes its size.
    """
    fleets = _fleets(settings)
    if list_fleets:
        if as_json:
            emit_json(fleets)
        else:
            emit_table("fleets", ["fleet"], [[f] for f in fleets])
        return
    if not fleet:
        raise InvalidInput(f"name a fleet with --fleet (known: {', '.join(fleets) or 'none'})")
    if fleet not in fleets:
        raise InvalidInput(f"unknown fleet {fleet!r} (known: {', '.join(fleets) or 'none'})")
    # The worker lives in the `workers` package, which `lanes` never imports.
    # exec, not a child: SIGTERM from a process manager reaches the supervisor.
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "workers.supervisor", "--fleet", fleet, "--loglevel", loglevel])

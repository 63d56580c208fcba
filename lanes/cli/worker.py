"""``lanes worker``: run one fleet's Celery worker, sized from its pool's width."""

from __future__ import annotations

import os
import sys

import click

from lanes.catalog import load_routing, open_catalog
from lanes.celery_client import HOSTED_FLEET
from lanes.cli.common import emit_json, emit_table, json_option, live_workers, pass_settings
from lanes.embedded import client_redis_url
from lanes.errors import InvalidInput, RedisUnavailable


def _fleets(settings) -> list[str]:
    table = load_routing(open_catalog(settings, create=False))
    return sorted({route.fleet or HOSTED_FLEET for route in table.workflows.values() if route.candidates})


def _list(settings, fleets: list[str], as_json: bool) -> None:
    try:
        live = live_workers(settings, fleets)
    except RedisUnavailable as exc:
        click.echo(f"warning: live workers unknown: {exc}", err=True)
        live = None
    if as_json:
        emit_json([{"fleet": f, "workers": None if live is None else live[f]} for f in fleets])
        return
    rows = []
    for fleet in fleets:
        names = None if live is None else live[fleet]
        rows.append([fleet, "?" if names is None else len(names), "" if not names else ", ".join(names)])
    emit_table("fleets", ["fleet", "live workers", "names"], rows)


@click.command(name="worker")
@click.option("--fleet", help="The fleet (primary pool name, or 'hosted') whose work to run.")
@click.option("--list", "list_fleets", is_flag=True, help="List the fleets of the catalog and exit.")
@click.option("--loglevel", default="WARNING", show_default=True)
@json_option
@pass_settings
def command(settings, fleet, list_fleets, loglevel, as_json) -> None:
    """Run the worker of one fleet until stopped (SIGTERM or Ctrl-C).

    The fleet runs a worker process per queue (foreground and background),
    each taking up to LANES_FLEET_HELD_MESSAGES messages (2,000) as lane
    waiters on green threads, and restarts them gracefully when the catalog
    changes what they hold.
    With --list: each fleet and its live workers (work for a fleet without one
    waits in its queue until one starts).
    """
    fleets = _fleets(settings)
    if list_fleets:
        _list(settings, fleets, as_json)
        return
    if not fleet:
        raise InvalidInput(f"name a fleet with --fleet (known: {', '.join(fleets) or 'none'})")
    if fleet not in fleets:
        raise InvalidInput(f"unknown fleet {fleet!r} (known: {', '.join(fleets) or 'none'})")
    # Never start the embedded Redis for a worker: it would be a fresh, empty
    # server that no client sends to. Once running, the worker rides out
    # restarts of the server at its recorded address.
    client_redis_url(settings)
    # The worker lives in the `workers` package, which `lanes` never imports.
    # exec, not a child: SIGTERM from a process manager reaches the supervisor.
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "workers.supervisor", "--fleet", fleet, "--loglevel", loglevel])

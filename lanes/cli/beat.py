"""``lanes beat``: the scheduler (hourly memory runs, the lane-config check)."""

from __future__ import annotations

import os
import sys

import click


@click.command(name="beat")
@click.option("--loglevel", default="INFO", show_default=True)
def command(loglevel) -> None:
    """Run the beat until stopped. Start one per machine if you like: one holds
    the Redis lock and runs the schedule, the others wait to take over."""
    # The beat lives in the `scheduler` package, which `lanes` never imports.
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "scheduler.main", "--loglevel", loglevel])

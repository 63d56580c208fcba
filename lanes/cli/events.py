"""``lanes events``: the routing event log (lane waits, bypasses)."""

from __future__ import annotations

import time

import click

from lanes.cli.common import emit_json, emit_table, json_option, pass_settings


# Keys of an event that have a column of their own; the rest is its detail.
_COLUMNS = {"id", "time", "kind", "pool", "workflow"}


@click.command(name="events")
@click.option("--kind", help="lane_wait, lane_bypass, ...")
@click.option("--pool", help="Only this pool's events.")
@click.option("--workflow", help="Only this workflow's events.")
@click.option("--since", type=float, help="Only events of the last N seconds.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@json_option
@pass_settings
def command(settings, kind, pool, workflow, since, limit, as_json) -> None:
    """List routing events, newest first."""
    from lanes.ops.events import list_events
    from lanes.routing.client import LanesClient

    client = LanesClient(settings)
    try:
        events = list_events(client, kind=kind, pool=pool, workflow=workflow, since=since, limit=limit)
    finally:
        client.close()
    if as_json:
        emit_json(events)
        return
    rows = []
    for e in events:
        detail = ", ".join(f"{k}={v}" for k, v in sorted(e.items()) if k not in _COLUMNS)
        rows.append([time.strftime("%H:%M:%S", time.localtime(e["time"])), e["kind"], e["pool"], e["workflow"], detail])
    emit_table(f"{len(events)} events", ["time", "kind", "pool", "workflow", "detail"], rows)

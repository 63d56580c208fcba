"""``lanes events``: the routing event log (lane waits, bypasses)."""

from __future__ import annotations

import time

import click

from lanes.cli.common import emit_json, emit_table, json_option, pass_settings
from lanes.embedded import client_redis_url
from lanes.redis_conn import connect
from lanes.routing.events import EventLog


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
    client = connect(client_redis_url(settings), timeout=settings.redis_timeout_seconds)
    try:
        log = EventLog(client, prefix=settings.key_prefix)
        events = log.list(
            kind=kind, pool=pool, workflow=workflow,
            since=None if since is None else time.time() - since, limit=limit,
        )
    finally:
        client.close()
    if as_json:
        emit_json([e.as_dict() for e in events])
        return
    rows = []
    for e in events:
        detail = ", ".join(f"{k}={v}" for k, v in sorted(e.detail.items()))
        rows.append([time.strftime("%H:%M:%S", time.localtime(e.time)), e.kind, e.pool, e.workflow, detail])
    emit_table(f"{len(events)} events", ["time", "kind", "pool", "workflow", "detail"], rows)

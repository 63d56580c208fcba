"""``lanes memory``: enqueue and list hourly memory runs, run the memory workers."""

from __future__ import annotations

import os
import sys

import click

from lanes.celery_client import make_celery
from lanes.cli.common import emit_json, emit_table, json_option, pass_settings
from lanes.clock import SystemClock
from lanes.memory import list_runs, open_memory, parse_time, rollups, status_counts
from lanes.memory.dispatch import enqueue_and_dispatch
from lanes.memory.tables import RUN_STATUSES
from lanes.redis_conn import resolve_redis_url


@click.group(name="memory")
def command() -> None:
    """Hourly memory runs: one per chat hour, run at background priority."""


@command.command(name="enqueue")
@click.option("--now", "now_text", help="Act as if it were this UTC time (ISO 8601 with a zone). Default: now.")
@click.option("--full", is_flag=True, help="Scan the whole retention window, not only the last two completed hours.")
@json_option
@pass_settings
def enqueue(settings, now_text, full, as_json) -> None:
    """Create (and send to the memory workers) the runs the beat would create at NOW."""
    now = parse_time(now_text) if now_text else SystemClock().now()
    engine = open_memory(settings)
    celery = make_celery(settings, resolve_redis_url(settings))
    try:
        result, sent = enqueue_and_dispatch(engine, celery, settings, now=now, full=full)
    finally:
        celery.close()
        engine.dispose()
    if as_json:
        emit_json({**result.as_dict(), "sent": len(sent)})
        return
    click.echo(
        f"{result.scan} scan of hours {result.window.start:%Y-%m-%d %H:%M} .. {result.window.end:%Y-%m-%d %H:%M} UTC: "
        f"{len(result.created)} run{'s' if len(result.created) != 1 else ''} created, {len(sent)} sent"
        + (f", {result.deferred} held back by the daily cap (they carry over)" if result.deferred else "")
    )


@command.command(name="runs")
@click.option("--status", "statuses", multiple=True, type=click.Choice(RUN_STATUSES),
              help="Only runs in this status (repeatable).")
@click.option("--chat", "chat_id", help="Only this chat's runs.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=50, show_default=True)
@json_option
@pass_settings
def runs(settings, statuses, chat_id, limit, as_json) -> None:
    """List memory runs (newest hour first), their status counts and the daily rollups."""
    engine = open_memory(settings)
    try:
        found = list_runs(engine, statuses=tuple(statuses), chat_id=chat_id, limit=limit)
        counts = status_counts(engine)
        days = rollups(engine)
    finally:
        engine.dispose()
    if as_json:
        emit_json({"runs": [r.as_dict() for r in found], "counts": counts, "days": [d.as_dict() for d in days]})
        return
    emit_table(
        f"{len(found)} memory runs ({', '.join(f'{k} {v}' for k, v in counts.items())})",
        ["id", "chat", "hour (UTC)", "status", "attempts", "created", "error"],
        [[r.id, r.chat_id, f"{r.hour:%Y-%m-%d %H:00}", r.status, r.attempts, f"{r.created_at:%Y-%m-%d %H:%M}",
          (r.error or "")[:60]] for r in found],
    )
    if days:
        emit_table("runs per UTC day", ["day", "created", "held back by the cap"],
                   [[d.day.isoformat(), d.runs_created, d.skipped_by_cap] for d in days])


@command.command(name="worker")
@click.option("--loglevel", default="WARNING", show_default=True)
def worker(loglevel) -> None:
    """Run the memory workers until stopped (SIGTERM or Ctrl-C).

    They number the memory primary's width x LANES_MEMORY_WORKERS_PER_LANE,
    within the floor and cap, and are restarted at the new size when the
    catalog changes it.
    """
    # The worker lives in the `workers` package, which `lanes` never imports.
    # exec, not a child: SIGTERM from a process manager reaches the supervisor.
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "workers.memory_fleet", "--loglevel", loglevel])

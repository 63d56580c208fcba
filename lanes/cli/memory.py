"""``lanes memory``: enqueue, list and retry hourly memory runs, run the memory workers."""

from __future__ import annotations

import os
import sys

import click

from lanes.celery_client import make_celery
from lanes.cli.common import emit_json, emit_table, json_option, pass_settings
from lanes.clock import SystemClock
from lanes.errors import InvalidInput
from lanes.memory import get_run, list_runs, open_memory, parse_time, rollups, status_counts
from lanes.memory.dispatch import enqueue_and_dispatch, send_unsent
from lanes.memory.lifecycle import retry_failed
from lanes.memory.tables import RUN_STATUSES
from lanes.redis_conn import connect, resolve_redis_url

# A --now this far ahead of the clock is still "now" (a script computing it a moment early).
NOW_SKEW_SECONDS = 1.0


@click.group(name="memory")
def command() -> None:
    """Hourly memory runs: one per chat hour, run at background priority."""


@command.command(name="enqueue")
@click.option("--now", "now_text", help="Act as if it were this UTC time (ISO 8601 with a zone). Default: now.")
@click.option("--full", is_flag=True, help="Scan the whole retention window, not only the last two completed hours.")
@json_option
@pass_settings
def enqueue(settings, now_text, full, as_json) -> None:
    """Create (and send to the memory workers) the runs the beat would create at NOW.

    NOW may be in the past (catching up), never in the future: a run covers a
    completed hour only.
    """
    clock_now = SystemClock().now()
    now = parse_time(now_text) if now_text else clock_now
    if (now - clock_now).total_seconds() > NOW_SKEW_SECONDS:
        raise InvalidInput(
            f"--now {now_text} is in the future (the clock says {clock_now:%Y-%m-%dT%H:%M:%SZ}); memory runs "
            "cover completed hours only: give a past time or leave --now out"
        )
    engine = open_memory(settings)
    redis_url = resolve_redis_url(settings)
    celery = make_celery(settings, redis_url)
    client = connect(redis_url, timeout=settings.redis_timeout_seconds)
    try:
        result, dispatched = enqueue_and_dispatch(engine, celery, settings, client=client, now=now, full=full)
    finally:
        client.close()
        celery.close()
        engine.dispose()
    sent = dispatched.sent
    if as_json:
        emit_json({**result.as_dict(), "sent": len(sent), "reclaimed": dispatched.reclaimed})
        return
    click.echo(
        f"{result.scan} scan of hours {result.window.start:%Y-%m-%d %H:%M} .. {result.window.end:%Y-%m-%d %H:%M} UTC: "
        f"{len(result.created)} run{'s' if len(result.created) != 1 else ''} created, {len(sent)} sent"
        + (f", {result.deferred} held back by the daily cap (they carry over)" if result.deferred else "")
        + (f", {result.expired} held back so long they left the retention window" if result.expired else "")
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
    engine = open_memory(settings, create=False)
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
        emit_table("runs per UTC day", ["day", "created", "held back by the cap", "expired in the backlog"],
                   [[d.day.isoformat(), d.runs_created, d.skipped_by_cap, d.expired_by_retention] for d in days])
    if counts["failed"] and not as_json:
        click.echo(f"{counts['failed']} failed: `lanes memory retry` queues them again (--run ID or --chat CHAT "
                   "for some of them)")


@command.command(name="retry")
@click.option("--run", "run_ids", multiple=True, type=click.IntRange(1), help="Only this run (repeatable).")
@click.option("--chat", "chat_id", help="Only this chat's failed runs.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=1000, show_default=True)
@json_option
@pass_settings
def retry(settings, run_ids, chat_id, limit, as_json) -> None:
    """Queue failed runs again with a fresh count of attempts, and send them to the memory workers.

    Without --run or --chat, every failed run (up to --limit). Runs that are
    not failed are left alone.
    """
    engine = open_memory(settings, create=False)
    try:
        if run_ids:
            known = {i: get_run(engine, i) for i in run_ids}
            unknown = [i for i in run_ids if known[i] is None]
            if unknown:
                raise InvalidInput(f"no memory run {unknown[0]} (lanes memory runs --status failed lists them)")
            not_failed = [f"{i} is {known[i].status}" for i in run_ids if known[i].status != "failed"]
            if not_failed:
                raise InvalidInput(f"only failed runs are retried: run {', run '.join(not_failed)}")
        queued = retry_failed(engine, now=SystemClock().now(), run_ids=tuple(run_ids), chat_id=chat_id, limit=limit)
        redis_url = resolve_redis_url(settings)
        celery = make_celery(settings, redis_url)
        client = connect(redis_url, timeout=settings.redis_timeout_seconds)
        try:
            dispatched = send_unsent(engine, celery, client, prefix=settings.key_prefix, now=SystemClock().now())
        finally:
            client.close()
            celery.close()
    finally:
        engine.dispose()
    if as_json:
        emit_json({"queued": [r.id for r in queued], "sent": len(dispatched.sent)})
        return
    click.echo(f"{len(queued)} failed run{'s' if len(queued) != 1 else ''} queued again, "
               f"{len(dispatched.sent)} sent to the memory workers")


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
    os.execv(sys.executable, [sys.executable, "-m", "workers.memory.fleet", "--loglevel", loglevel])

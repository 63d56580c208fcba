"""Publishing memory runs to the memory workers, by task name.

``lanes`` never imports ``workers``: the task is named here and the memory
worker (``workers/memory.py``) registers a task under the same name. Memory
runs have a Celery queue of their own, taken only by memory workers, whose
number follows the memory primary's lane width (seed 004); in the lane they
wait at background priority behind interactive and user-tool work.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from celery import Celery
from sqlalchemy.engine import Engine

from lanes.celery_client import MESSAGE_PRIORITY, QUEUE_PREFIX
from lanes.errors import RedisUnavailable
from lanes.memory.runs import EnqueueResult, enqueue_runs, stale_queued
from lanes.priority import Priority
from lanes.settings import Settings

MEMORY_TASK = "lanes.memory.run"
MEMORY_QUEUE = f"{QUEUE_PREFIX}memory"


def dispatch_runs(celery: Celery, run_ids: list[int]) -> list[str]:
    """Send one message per run; return the Celery task ids, in order."""
    sent = []
    try:
        for run_id in run_ids:
            result = celery.send_task(
                MEMORY_TASK, args=[run_id], queue=MEMORY_QUEUE, priority=MESSAGE_PRIORITY[Priority.BACKGROUND]
            )
            sent.append(result.id)
    except Exception as exc:  # kombu and redis-py raise many kinds; all mean "not sent"
        detail = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise RedisUnavailable(
            f"could not send memory runs to the broker ({detail}); the runs stay queued and a tick an hour "
            "from now sends them again"
        ) from None
    return sent


# Queued runs whose message may have been lost (a broker restart) are sent
# again by the next tick once they have sat this long; a duplicate message is
# harmless (a finished run is skipped, notes are replaced whole).
STALE_QUEUED = timedelta(hours=1)


def enqueue_and_dispatch(engine: Engine, celery: Celery, settings: Settings, *, now: datetime,
                         full: bool) -> tuple[EnqueueResult, list[str]]:
    """Create the runs due at ``now`` and send them to the memory workers; (result, task ids sent)."""
    result = enqueue_runs(
        engine, now=now, full=full, retention_days=settings.memory_retention_days,
        daily_cap=settings.memory_daily_cap,
    )
    ids = [run.id for run in result.created]
    fresh = set(ids)
    ids += [run.id for run in stale_queued(engine, now=now, older_than=STALE_QUEUED) if run.id not in fresh]
    return result, dispatch_runs(celery, ids)

"""Publishing memory runs to the memory workers, by task name.

``lanes`` never imports ``workers``: the task is named here and the memory
worker (``workers/memory/worker.py``) registers a task under the same name. Memory
runs have a Celery queue of their own, taken only by memory workers, whose
number follows the memory primary's lane width (seed 004); in the lane they
wait at background priority behind interactive and user-tool work.

Each queued run is sent once per **broker epoch**: a random token kept in
Redis beside the broker's queues (``SET NX``). While Redis keeps its data
the token stays and so do the messages: a run sent in this epoch is not
sent again however long it waits. When Redis loses its data the token goes
with the messages; the next tick finds a new epoch and sends every queued
run once more. A duplicate message that slips through anyway (a tick
racing a send) is harmless: a run executes once per claim.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime

import redis
from celery import Celery
from sqlalchemy.engine import Engine

from lanes.celery_client import MESSAGE_PRIORITY, QUEUE_PREFIX
from lanes.errors import RedisUnavailable
from lanes.memory.lifecycle import mark_sent, reclaim_orphans, unsent_runs
from lanes.memory.runs import EnqueueResult, enqueue_runs
from lanes.namespace import Namespace
from lanes.priority import Priority
from lanes.settings import Settings

log = logging.getLogger("lanes.memory")

MEMORY_TASK = "lanes.memory.run"
MEMORY_QUEUE = f"{QUEUE_PREFIX}memory"


def broker_epoch(client: redis.Redis, *, prefix: str) -> str:
    """The broker's current epoch, started here when Redis holds none."""
    key = Namespace(prefix).memory_epoch
    try:
        client.set(key, uuid.uuid4().hex, nx=True)
        value = client.get(key)
    except redis.RedisError as exc:
        raise RedisUnavailable(f"Redis did not answer the memory broker epoch: {exc}; the runs stay queued "
                               "and the next tick sends them") from None
    return value.decode() if isinstance(value, bytes) else str(value)


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
            f"could not send memory runs to the broker ({detail}); the runs stay queued and the next tick "
            "sends them"
        ) from None
    return sent


@dataclass(frozen=True)
class Dispatched:
    sent: list[str] = field(default_factory=list)  # Celery task ids
    reclaimed: int = 0  # running runs whose lease had passed, given back and sent again


def send_unsent(engine: Engine, celery: Celery, client: redis.Redis, *, prefix: str,
                now: datetime) -> Dispatched:
    """Reclaim orphaned runs, then send every queued run that has no message in this epoch."""
    reclaimed = reclaim_orphans(engine, now=now)
    epoch = broker_epoch(client, prefix=prefix)
    runs = unsent_runs(engine, epoch=epoch)
    ids = [run.id for run in runs]
    sent: list[str] = []
    # In slices, each marked once sent: a broker failure half-way keeps what was sent.
    for start in range(0, len(ids), 200):
        chunk = ids[start:start + 200]
        sent += dispatch_runs(celery, chunk)
        mark_sent(engine, chunk, epoch=epoch)
    return Dispatched(sent, len(reclaimed))


def enqueue_and_dispatch(engine: Engine, celery: Celery, settings: Settings, *, client: redis.Redis,
                         now: datetime, full: bool) -> tuple[EnqueueResult, Dispatched]:
    """Create the runs due at ``now`` and send what is unsent to the memory workers."""
    result = enqueue_runs(
        engine, now=now, full=full, retention_days=settings.memory_retention_days,
        daily_cap=settings.memory_daily_cap,
    )
    return result, send_unsent(engine, celery, client, prefix=settings.key_prefix, now=now)


def memory_tick(engine: Engine, celery: Celery, settings: Settings, *, client: redis.Redis, now: datetime,
                full: bool = False) -> dict:
    """One tick of the beat's memory job: the runs due at ``now`` created and sent, summed up and logged."""
    result, dispatched = enqueue_and_dispatch(engine, celery, settings, client=client, now=now, full=full)
    summary = {**result.as_dict(), "sent": len(dispatched.sent), "reclaimed": dispatched.reclaimed}
    summary.pop("runs")
    log.info("memory tick: %s", summary)
    if result.expired:
        log.warning("memory tick: %s chat hours held back by the daily cap left the %s-day retention window "
                    "without a run (raise LANES_MEMORY_DAILY_CAP or LANES_MEMORY_RETENTION_DAYS)",
                    result.expired, settings.memory_retention_days)
    if dispatched.reclaimed:
        log.warning("memory tick: %s running runs had lost their worker (lease passed); sent again",
                    dispatched.reclaimed)
    return summary

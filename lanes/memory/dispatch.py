"""Publishing memory runs to the memory workers, by task name.

``lanes`` never imports ``workers``: the task is named here and the memory
worker (``workers/memory.py``) registers a task under the same name. Memory
runs have a Celery queue of their own, taken only by memory workers, whose
number follows the memory primary's lane width (seed 004); in the lane they
wait at background priority behind interactive and user-tool work.
"""

from __future__ import annotations

from celery import Celery

from lanes.celery_client import MESSAGE_PRIORITY, QUEUE_PREFIX
from lanes.errors import RedisUnavailable
from lanes.priority import Priority

MEMORY_TASK = "lanes.memory.run"
MEMORY_QUEUE = f"{QUEUE_PREFIX}memory"


def dispatch_runs(celery: Celery, run_ids: list[int]) -> int:
    """Send one message per run; return how many were sent."""
    try:
        for run_id in run_ids:
            celery.send_task(
                MEMORY_TASK, args=[run_id], queue=MEMORY_QUEUE, priority=MESSAGE_PRIORITY[Priority.BACKGROUND]
            )
    except RedisUnavailable:
        raise
    except Exception as exc:
        detail = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise RedisUnavailable(
            f"could not send memory runs to the broker ({detail}); the runs stay queued and the next full scan "
            "sends them again"
        ) from None
    return len(run_ids)

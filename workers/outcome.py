"""A task's outcome is recorded before its message is acknowledged, or the message stays.

Tasks ack late, so the broker keeps a message until its task's end is
recorded. Two of Celery's defaults break that when Redis refuses writes for a
moment (a full no-eviction server, a failover):

- the result (or the failure) cannot be stored: Celery logs "Exception raised
  outside body" and acknowledges the message anyway, so the task ends with no
  state at all (left STARTED or PENDING, no answer, no trace);
- a retry cannot be published: ``Task.retry`` turns the refused publish into
  ``Reject(requeue=False)`` and the message is dropped.

Both are the same few seconds of refused writes that made the walk end in
RedisUnavailable in the first place. So the worker waits for Redis: the
result backend retries every "Redis did not answer" error (lanes.redis_conn's
list, the full server included, not only lost connections) with backoff,
and a retry's publish is tried again the same way; a retry that still cannot
be published hands the message back to the broker (``Reject(requeue=True)``,
which leaves it in kombu's unacked record if Redis refuses that too, for the
visibility timeout to bring back) instead of dropping it.
"""

from __future__ import annotations

import logging
import time

from celery.backends.redis import RedisBackend
from celery.exceptions import Reject

from lanes.redis_conn import REDIS_UNAVAILABLE

log = logging.getLogger("lanes.worker")

# The result backend's patience (Celery's result_backend_* retry options):
# exponential backoff from 100 ms, at most 2 s apart, 30 tries (about 45 s).
RESULT_STORE_RETRY = {
    "result_backend_always_retry": True,
    "result_backend_base_sleep_between_retries_ms": 100,
    "result_backend_max_sleep_between_retries_ms": 2_000,
    "result_backend_max_retries": 30,
}
# Pauses between tries of a retry's publish (about 30 s in all).
PUBLISH_PAUSES = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0)


class PatientRedisBackend(RedisBackend):
    """Celery's Redis result backend, retrying whatever means "Redis did not answer"."""

    def exception_safe_to_retry(self, exc: BaseException) -> bool:
        return isinstance(exc, REDIS_UNAVAILABLE) or super().exception_safe_to_retry(exc)


def patient_backend_url(redis_url: str) -> str:
    """``result_backend`` naming PatientRedisBackend on ``redis_url`` (Celery's ``class+url`` form)."""
    return f"{PatientRedisBackend.__module__}:{PatientRedisBackend.__name__}+{redis_url}"


def publish_retry(task, *, pauses: tuple[float, ...] = PUBLISH_PAUSES, **options):
    """``task.retry(**options)`` that never drops the task when the publish is refused.

    Raises Celery's ``Retry`` once the retry is queued; after every pause,
    ``Reject(requeue=True)``: the original message goes back to the broker.
    """
    for pause in (*pauses, None):
        try:
            return task.retry(**options)  # raises Retry: the retry is queued
        except Reject as exc:
            if exc.requeue:
                raise
            refused = exc
        if pause is None:
            break
        log.warning("could not queue the retry of %s (%s); trying again in %.2fs", task.request.id, refused.reason, pause)
        time.sleep(pause)
    raise Reject(f"could not queue the retry ({refused.reason}); handed back to the broker", requeue=True) from None

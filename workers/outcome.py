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

import functools
import logging
import time
from importlib.resources import files

import redis
from celery import states
from celery.backends.redis import RedisBackend
from celery.exceptions import BackendStoreError, Reject
from kombu.utils.encoding import bytes_to_str
from kombu.utils.objects import cached_property

from lanes.redis_conn import REDIS_UNAVAILABLE, refusal_in_script

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
    """Celery's Redis result backend, retrying whatever means "Redis did not
    answer", and storing a task's state in one round trip."""

    def exception_safe_to_retry(self, exc: BaseException) -> bool:
        # Celery's client has redis-py's own parser: a full Redis 6.2 refuses the
        # store script's write as a plain script error, which is the same refusal.
        return isinstance(refusal_in_script(exc), REDIS_UNAVAILABLE) or super().exception_safe_to_retry(exc)

    @property
    def ConnectionPool(self):  # noqa: N802 (Celery's name)
        # A worker sets redis_max_connections (workers/app.py) for a pool its
        # tasks share: past it a store waits for a free connection, as long
        # as a command may take, instead of being refused.
        if self.max_connections is None or self._ConnectionPool is not None:
            return super().ConnectionPool
        wait = float(self.connparams.get("socket_timeout") or 5.0)
        return functools.partial(redis.BlockingConnectionPool, timeout=wait)

    @cached_property
    def _store_script(self):
        # Celery's store of a task's state in one round trip (the script's header says how).
        return self.client.register_script(
            files("workers").joinpath("scripts", "store_result.lua").read_text(encoding="utf-8"))

    def _store_result(self, task_id, result, state, traceback=None, request=None, **kwargs):
        # The script reads the stored state as JSON: any other encoding goes Celery's way.
        if self.serializer != "json" or self.app.conf.result_compression:
            return super()._store_result(task_id, result, state, traceback=traceback, request=request, **kwargs)
        meta = self._get_result_meta(result=result, state=state, traceback=traceback, request=request)
        meta["task_id"] = bytes_to_str(task_id)
        value = self.encode(meta)
        if len(value) > self._MAX_STR_VALUE_SIZE:
            raise BackendStoreError("value too large for Redis backend", state=state, task_id=task_id)
        expires = self.failure_expires if state == states.FAILURE else self.expires
        milliseconds = int(float(expires) * 1000) if expires else 0
        # Run again after a lost reply, it stores the same value (and a second
        # PUBLISH tells a waiting client what it was told already).
        self.ensure(self._store_script, ([self.get_key_for_task(task_id)], [value, milliseconds]))
        return result


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

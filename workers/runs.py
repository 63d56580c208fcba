"""One delivery of a routed task runs at a time.

The Redis broker can hand a task to a second worker while the first still
runs it: when a worker's broker connection drops, kombu closes the channel
and puts every unacknowledged message back in its queue, although the tasks
behind them keep running on the worker's threads (the threads pool cannot
stop them). A second delivery would call the backend again.

So each delivery first takes the task's run lease (``SET NX`` with a time to
live as long as a walk may last, below the visibility timeout, so a lease of
a killed worker has lapsed by the time the broker redelivers its task). A
delivery that finds the lease taken, or the task already finished, does not
walk: it ends quietly when the task is finished, and otherwise comes back
later to look again (the first delivery may still die).
"""

from __future__ import annotations

import uuid
from functools import cache
from importlib.resources import files

import redis

from lanes.errors import RedisUnavailable
from lanes.namespace import Namespace
from lanes.redis_conn import REDIS_UNAVAILABLE

LEASE_MARGIN_SECONDS = 5.0


@cache
def _release_source() -> str:
    return (files("workers") / "scripts" / "run_release.lua").read_text()


class RunLeases:
    def __init__(self, client: redis.Redis, *, prefix: str, ttl_seconds: float) -> None:
        self._client = client
        self._names = Namespace(prefix)
        self._ttl_ms = int((ttl_seconds + LEASE_MARGIN_SECONDS) * 1000)
        self._release = client.register_script(_release_source())

    def claim(self, task_id: str) -> str | None:
        """A token when this delivery may run the task, None when another one runs it."""
        token = uuid.uuid4().hex
        try:
            taken = self._client.set(self._names.task_run(task_id), token, nx=True, px=self._ttl_ms)
        except REDIS_UNAVAILABLE as exc:
            raise RedisUnavailable(f"Redis did not answer the run lease of task {task_id}: {exc}") from exc
        return token if taken else None

    def release(self, task_id: str, token: str) -> None:
        """Best effort: a lease left behind lapses on its own."""
        try:
            self._release(keys=[self._names.task_run(task_id)], args=[token])
        except redis.RedisError:
            pass

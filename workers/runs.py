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

The claim is one script call (``run_claim.lua``) that also stores the task's
STARTED result, which the route task does not leave to Celery's tracer: the
tracer reads the result and writes it, two round trips on every task's way
to its lane, and on a busy worker each is a wait for the interpreter lock
(docs/BENCHMARKS.md, "tenth round"). The lease key and the result key live
on the one Redis of ``redis_url`` (lanes, broker and results share it).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

import redis

from lanes.errors import RedisUnavailable
from lanes.lane.base import text
from lanes.namespace import Namespace
from lanes.redis_conn import REDIS_UNAVAILABLE

LEASE_MARGIN_SECONDS = 5.0


@cache
def _source(name: str) -> str:
    return (files("workers") / "scripts" / f"{name}.lua").read_text()


@dataclass(frozen=True)
class Started:
    """The STARTED result a delivery stores as it takes the lease: Celery's
    result key for the task, the encoded result, its time to live (0: none)."""

    key: str
    value: str | bytes
    ttl_seconds: int


@dataclass(frozen=True)
class Claim:
    """What a delivery found: its lease token when it runs the task, the
    task's end state when the task had already ended, neither when another
    delivery runs it now."""

    token: str | None = None
    finished: str | None = None


class RunLeases:
    def __init__(self, client: redis.Redis, *, prefix: str, ttl_seconds: float) -> None:
        self._client = client
        self._names = Namespace(prefix)
        self._ttl_ms = int((ttl_seconds + LEASE_MARGIN_SECONDS) * 1000)
        self._claim = client.register_script(_source("run_claim"))
        self._release = client.register_script(_source("run_release"))

    def claim(self, task_id: str, started: Started) -> Claim:
        """Take the task's run lease unless the task ended or another delivery
        holds it; with the lease, the task's result says ``started``."""
        token = uuid.uuid4().hex
        try:
            reply = self._claim(keys=[self._names.task_run(task_id), started.key],
                                args=[token, self._ttl_ms, started.value, started.ttl_seconds])
        except REDIS_UNAVAILABLE as exc:
            raise RedisUnavailable(f"Redis did not answer the run lease of task {task_id}: {exc}") from exc
        outcome = text(reply[0])
        if outcome == "run":
            return Claim(token=token)
        if outcome == "finished":
            return Claim(finished=text(reply[1]))
        return Claim()

    def release(self, task_id: str, token: str) -> None:
        """Best effort: a lease left behind lapses on its own."""
        try:
            self._release(keys=[self._names.task_run(task_id)], args=[token])
        except redis.RedisError:
            pass

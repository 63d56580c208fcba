"""One delivery of a routed task runs at a time.

The Redis broker can hand a task to a second worker while the first still
runs it: when a worker's broker connection drops, kombu closes the channel
and puts every unacknowledged message back in its queue, although the tasks
behind them keep running on the worker's threads (the threads pool cannot
stop them). A second delivery would call the backend again.

So each delivery first takes the task's run lease (``SET NX`` with a time to
live of one message lease, renewed every third of it by the worker while the
delivery lives, so a lease of a killed worker has lapsed by the time the
broker gives its message back, one message lease after the worker's last
refresh of it; lanes/broker.py). A
delivery that finds the lease taken, or the task already finished, does not
walk: it ends quietly when the task is finished, and otherwise comes back
later to look again (the first delivery may still die).

The claim is one script call (``run_claim.lua``) that also stores the task's
STARTED result, which the route task does not leave to Celery's tracer: the
tracer reads the result and writes it, two round trips on every task's way
to its lane, and on a busy worker each is a wait for the interpreter lock
(docs/BENCHMARKS_JOURNAL.md, "tenth round"). The lease key and the result key live
on the one Redis of ``redis_url`` (lanes, broker and results share it).
"""

from __future__ import annotations

import logging
import threading
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

log = logging.getLogger("lanes.worker")


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
    task's end state when the task had already ended, ``revoked`` when a
    revoke through Lanes came before it, none of these when another delivery
    runs it now."""

    token: str | None = None
    finished: str | None = None
    revoked: bool = False


class RunLeases:
    def __init__(self, client: redis.Redis, *, prefix: str, ttl_seconds: float) -> None:
        self._client = client
        self._names = Namespace(prefix)
        self._ttl_ms = int((ttl_seconds + LEASE_MARGIN_SECONDS) * 1000)
        self._claim = client.register_script(_source("run_claim"))
        self._release = client.register_script(_source("run_release"))
        self._renew = client.register_script(_source("run_renew"))
        self._held: dict[str, str] = {}  # task id -> token of the leases this process holds
        self._lock = threading.Lock()

    def claim(self, task_id: str, started: Started) -> Claim:
        """Take the task's run lease unless the task ended or another delivery
        holds it; with the lease, the task's result says ``started``."""
        token = uuid.uuid4().hex
        try:
            reply = self._claim(keys=[self._names.task_run(task_id), started.key, self._names.revoked(task_id)],
                                args=[token, self._ttl_ms, started.value, started.ttl_seconds])
        except REDIS_UNAVAILABLE as exc:
            raise RedisUnavailable(f"Redis did not answer the run lease of task {task_id}: {exc}") from exc
        outcome = text(reply[0])
        if outcome == "run":
            with self._lock:
                self._held[task_id] = token
            return Claim(token=token)
        if outcome == "finished":
            return Claim(finished=text(reply[1]))
        if outcome == "revoked":
            return Claim(revoked=True)
        return Claim()

    def release(self, task_id: str, token: str, *, ended: bool = False) -> None:
        """End this delivery's hold of the lease. Best effort: a lease left
        behind lapses on its own.

        ``ended``: the task ended in this delivery (a result, or a failure
        that is not retried). Celery stores that outcome only after the task
        function returns, so the lease is left to lapse instead of deleted: a
        copy of the task delivered in between would otherwise find the lease
        free and the result still STARTED, and call the backend again. Such a
        copy looks again later and by then finds the outcome."""
        with self._lock:
            if self._held.get(task_id) == token:
                del self._held[task_id]
        if ended:
            return
        try:
            self._release(keys=[self._names.task_run(task_id)], args=[token])
        except redis.RedisError:
            pass

    def renew_all(self) -> int:
        """Extend every lease this process holds by one lease period; how many were still ours."""
        with self._lock:
            held = list(self._held.items())
        if not held:
            return 0
        # One key per script call (a lease key is the task's own; in a cluster
        # leases live on many slots), pipelined.
        with self._client.pipeline(transaction=False) as pipe:
            for task_id, token in held:
                self._renew(keys=[self._names.task_run(task_id)], args=[self._ttl_ms, token], client=pipe)
            return sum(int(n or 0) for n in pipe.execute())

    def start_renewing(self, every_seconds: float) -> threading.Event:
        """Renew the held leases every ``every_seconds`` on a thread (a green
        thread under the gevent pool) until the returned event is set."""
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(every_seconds):
                try:
                    self.renew_all()
                except redis.RedisError as exc:  # Redis away: the next turn tries again
                    log.debug("run leases not renewed: %s", exc)

        threading.Thread(target=run, name="lanes-run-leases", daemon=True).start()
        return stop

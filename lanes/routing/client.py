"""Submitting routed work and reading its result.

``LanesClient.submit`` validates everything against the catalog before
anything is enqueued; a bad request raises ``InvalidInput`` and leaves no
trace in Redis.

What is kept, and for how long: the request (payload included) lives only in
its queue message until a worker has run it; the result keeps the answer and
the routing trace, never the request's arguments, for ``result_ttl_seconds``
(24 h by default); an idempotency key keeps the task id and a hash of the
request for ``idempotency_ttl_seconds``.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import replace
from datetime import datetime
from functools import cached_property

import redis
from celery.result import AsyncResult
from celery.states import READY_STATES

from lanes.catalog import RoutingTable, open_catalog
from lanes.celery_client import HOSTED_FLEET, MESSAGE_PRIORITY, ROUTE_TASK, make_celery, queue_for, shown_arguments
from lanes.embedded import client_redis_url
from lanes.errors import InvalidInput, NotFound, RedisUnavailable, ResultLost
from lanes.namespace import Namespace
from lanes.presence import WorkerPresence
from lanes.priority import Priority
from lanes.redis_conn import REDIS_UNAVAILABLE, connect
from lanes.routing.idempotency import IdempotencyKey, check_key, request_fingerprint
from lanes.routing.request import RouteRequest, check_payload, parse_deadline
from lanes.routing.trace import TraceStore
from lanes.routing.view import CatalogView
from lanes.settings import Settings, broker_url_of, load_settings, mask_url, result_url_of

# The revokes stream keeps about this many of the newest revokes: a worker
# reads it every second, so only a burst larger than this within one second
# could pass a worker that also missed the broadcasts.
REVOKES_KEPT = 10_000


class LanesClient:
    """Publishes routed work for a catalog and reads results back."""

    def __init__(self, settings: Settings | None = None, *, redis_url: str | None = None) -> None:
        self.settings = settings or load_settings()
        self._redis_url = redis_url

    # The catalog is opened on first use (reading a result needs none). A client
    # only reads it: a misspelt path is refused, never created.
    @cached_property
    def engine(self):
        return open_catalog(self.settings, create=False)

    @cached_property
    def catalog(self) -> CatalogView:
        return CatalogView(self.engine)

    # Redis is reached only once something is sent or read, so a refused
    # submit has touched nothing. A client never starts the embedded server:
    # work sent to a fresh one would never reach the workers of the old one.
    @cached_property
    def redis_url(self) -> str:
        return self._redis_url or client_redis_url(self.settings)

    @cached_property
    def redis(self) -> redis.Redis:
        return connect(self.redis_url, timeout=self.settings.redis_timeout_seconds)

    @cached_property
    def broker_url(self) -> str:
        return broker_url_of(self.settings, self.redis_url)

    @cached_property
    def result_url(self) -> str:
        return result_url_of(self.settings, self.redis_url)

    @cached_property
    def results_redis(self) -> redis.Redis:
        """The result store's Redis: idempotency keys and accepted-task records live there,
        beside the results they lead to (durable; the lanes' Redis need not be)."""
        if self.result_url == self.redis_url:
            return self.redis
        return connect(self.result_url, timeout=self.settings.redis_timeout_seconds)

    @cached_property
    def celery(self):
        return make_celery(self.settings, self.redis_url)

    @cached_property
    def traces(self) -> TraceStore:
        return TraceStore(self.redis, prefix=self.settings.key_prefix, ttl_seconds=self.settings.result_ttl_seconds)

    def table(self) -> RoutingTable:
        return self.catalog.table()

    def submit(
        self,
        workflow: str,
        payload: dict | str,
        *,
        priority: Priority | str | None = None,
        deadline: float | datetime | None = None,
        idempotency_key: str | None = None,
    ) -> AsyncResult:
        route = self.catalog.workflow(workflow)
        chosen = route.priority if priority is None else Priority.parse(priority)
        now = time.time()
        if deadline is None and route.default_deadline_seconds is not None:
            deadline = route.default_deadline_seconds
        body = check_payload(payload, kind=route.candidates[0].kind, workflow=workflow)
        self._check_size(workflow, body)
        request = RouteRequest(
            task_id=str(uuid.uuid4()),
            workflow=workflow,
            payload=body,
            priority=chosen,
            deadline=parse_deadline(deadline, now=now),
            submitted_at=now,
            idempotency_key=None if idempotency_key is None else check_key(idempotency_key),
        )
        binding = fingerprint = None
        if idempotency_key is not None:
            binding = IdempotencyKey(
                self.results_redis, prefix=self.settings.key_prefix, workflow=workflow, key=idempotency_key,
                claim_seconds=self.settings.idempotency_claim_seconds,
                ttl_seconds=self.settings.idempotency_ttl_seconds,
            )
            fingerprint = request_fingerprint(workflow, body, chosen.label)
            claim = binding.claim(request.task_id, fingerprint)
            if not claim.send:
                return self.celery.AsyncResult(claim.task_id)
            # The key's task id: a binding left unconfirmed (a lost publish reply) is sent again
            # under its own id, which the worker's run lease joins with a copy already queued.
            request = replace(request, task_id=claim.task_id)
        self._mark_accepted(request.task_id, binding)
        try:
            # Known from now on, for as long as its result is kept: a revoke
            # or a read of an id never submitted can then say so.
            self.redis.set(Namespace(self.settings.key_prefix).submitted(request.task_id), workflow,
                           ex=self.settings.result_ttl_seconds)
            self.celery.send_task(
                ROUTE_TASK,
                args=[request.to_message()],
                task_id=request.task_id,
                queue=queue_for(route.fleet or HOSTED_FLEET, chosen),
                priority=MESSAGE_PRIORITY[chosen],
                **shown_arguments(workflow=workflow, priority=chosen, fleet=route.fleet or HOSTED_FLEET,
                                  deadline=request.deadline),
            )
        except Exception as exc:
            # Whether the message is queued is unknown (the reply may be all that was lost),
            # so an idempotency key stays bound to this task id: a repeat sends this same task.
            detail = _first_line(exc)
            again = ("submit again with the same idempotency key: it sends this same task, never a second one"
                     if binding is not None else
                     "it may be queued if only the reply was lost; an idempotency key makes a repeat safe")
            raise RedisUnavailable(
                f"could not confirm that task {request.task_id} was queued: the broker Redis at "
                f"{mask_url(self.broker_url)} did not answer ({detail}); {again}"
            ) from None
        if binding is not None:
            try:
                binding.confirm(request.task_id, fingerprint)
            except redis.RedisError:
                pass  # the task is queued; a repeat sends the same task id again, joined by the run lease
        return self.celery.AsyncResult(request.task_id)

    def _mark_accepted(self, task_id: str, binding: IdempotencyKey | None) -> None:
        """Record on the result store that ``task_id`` is being queued, before the publish:
        a waiter who later finds neither this nor a result knows the record was lost
        (``wait``), rather than reading PENDING forever."""
        try:
            self.results_redis.set(Namespace(self.settings.key_prefix).accepted(task_id), "1",
                                   ex=self.settings.result_ttl_seconds)
        except REDIS_UNAVAILABLE as exc:
            if binding is not None:
                try:
                    binding.release(task_id)  # nothing was sent
                except redis.RedisError:
                    pass  # unconfirmed: the next submit with the key sends the task
            raise RedisUnavailable(
                f"could not enqueue the task: Redis at {mask_url(self.result_url)} did not answer "
                f"({_first_line(exc)}); nothing was sent; check that it runs and LANES_RESULT_URL "
                "(or LANES_REDIS_URL) points at it"
            ) from None

    def _check_size(self, workflow: str, payload: dict) -> None:
        limit = self.settings.max_payload_bytes
        size = len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode())
        if size > limit:
            raise InvalidInput(
                f"payload for workflow {workflow!r} is {size} bytes, over the limit of {limit} bytes; "
                "send less, or raise LANES_MAX_PAYLOAD_BYTES"
            )

    def fleet_of(self, workflow: str) -> str:
        """The fleet whose workers run ``workflow``'s work."""
        return self.catalog.workflow(workflow).fleet or HOSTED_FLEET

    def live_workers(self, fleet: str) -> list[str]:
        """Names of ``fleet``'s workers that sent a heartbeat lately."""
        return WorkerPresence(self.redis, prefix=self.settings.key_prefix).live(fleet)

    def result(self, task_id: str) -> dict:
        """State, answer or error, and the routing trace of every attempt."""
        _check_task_id(task_id)
        result = self.celery.AsyncResult(task_id)
        state = result.state
        out: dict = {"task_id": task_id, "state": state, "attempts": self.traces.load(task_id)}
        if state == "SUCCESS":
            out["result"] = result.result
        elif state in ("FAILURE", "REVOKED"):
            error = result.result
            out["error"] = {"type": type(error).__name__, "message": str(error)}
        if state == "PENDING" and not out["attempts"]:
            out["note"] = (
                f"unknown task id, or not started yet (results are kept for {self.settings.result_ttl_seconds}s)"
            )
        return out

    def wait(self, task_id: str, timeout: float) -> dict | None:
        """Wait up to ``timeout`` seconds for ``task_id`` to end: its report, or None.

        A Redis that stops answering meanwhile is waited for (a restart of a
        persistent Redis loses nothing). A task that is neither ended, started,
        nor recorded as accepted has had its record lost with its Redis:
        ``ResultLost``, not PENDING forever.
        """
        _check_task_id(task_id)
        give_up = time.monotonic() + timeout
        pause = 0.05
        while True:
            try:
                report = self.result(task_id)
                if report["state"] in READY_STATES:
                    return report
                if report["state"] == "PENDING" and not report["attempts"] and not self._accepted(task_id):
                    raise ResultLost(
                        f"task {task_id} has no record in the result store at {mask_url(self.result_url)}: "
                        "its Redis lost it (restarted without persistence, or its records expired); the task "
                        "may never run. Submit it again (with the same idempotency key, it is sent at most once more)"
                    )
            except (*REDIS_UNAVAILABLE, RedisUnavailable, OSError):
                pass  # Redis away: wait for it within the timeout
            left = give_up - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(pause, left))
            pause = min(1.0, pause * 2)

    def _accepted(self, task_id: str) -> bool:
        return bool(self.results_redis.exists(Namespace(self.settings.key_prefix).accepted(task_id)))

    def revoke(self, task_id: str) -> dict:
        """Revoke ``task_id`` on every worker; its report as it stands now.

        A queued task is dropped when a worker receives it; a task waiting in
        a lane has its wait cancelled within a fraction of a second
        (``workers/cancel.py``), leaving nothing queued or held. A backend call
        already under way runs to its end: the threads pool cannot stop it.

        The broadcast reaches the workers listening now; the revoke mark, kept
        as long as results are, reaches every later delivery of the task (a
        worker started after the revoke, a message handed back by a restart):
        each checks it before it walks (``workers/scripts/run_claim.lua``).
        A broadcast is lost on a worker that is not subscribed at that
        moment (its broadcast connection starting or reconnecting), so the
        revoke is also appended to the revokes stream, which every worker
        reads about once a second while it has tasks under way.
        """
        _check_task_id(task_id)
        if not self._known(task_id):
            raise NotFound(
                f"unknown task {task_id!r}: no task with this id was submitted in the last "
                f"{self.settings.result_ttl_seconds}s (results are kept that long); nothing was revoked"
            )
        names = Namespace(self.settings.key_prefix)
        ttl = self.settings.result_ttl_seconds
        try:
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.set(names.revoked(task_id), 1, ex=ttl)
                pipe.xadd(names.revokes, {"task": task_id}, maxlen=REVOKES_KEPT, approximate=True)
                pipe.expire(names.revokes, ttl)
                pipe.execute()
            self.celery.control.revoke(task_id)
        except Exception as exc:
            detail = _first_line(exc)
            raise RedisUnavailable(
                f"could not revoke task {task_id}: Redis at {mask_url(self.redis_url)} did not answer ({detail})"
            ) from None
        return self.result(task_id)

    def _known(self, task_id: str) -> bool:
        """Whether ``task_id`` was submitted here, or has a state or a trace of its own."""
        try:
            if self.redis.exists(Namespace(self.settings.key_prefix).submitted(task_id)):
                return True
            return self.celery.AsyncResult(task_id).state != "PENDING" or bool(self.traces.load(task_id))
        except redis.RedisError as exc:
            raise RedisUnavailable(f"could not look task {task_id} up: Redis did not answer ({_first_line(exc)})") from None

    def close(self) -> None:
        if "results_redis" in self.__dict__ and self.results_redis is not self.__dict__.get("redis"):
            self.results_redis.close()
        if "redis" in self.__dict__:
            self.redis.close()
        if "celery" in self.__dict__:
            self.celery.close()
        if "engine" in self.__dict__:
            self.engine.dispose()


def _first_line(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


def _check_task_id(task_id: object) -> None:
    if not isinstance(task_id, str) or not task_id.strip() or len(task_id) > 255 or task_id != task_id.strip():
        raise InvalidInput(f"task id {task_id!r} is not a task id; pass the id `lanes submit` printed")


_default: LanesClient | None = None
_default_lock = threading.Lock()


def default_client() -> LanesClient:
    global _default
    with _default_lock:
        if _default is None:
            _default = LanesClient()
        return _default


def submit(
    workflow: str,
    payload: dict | str,
    *,
    priority: Priority | str | None = None,
    deadline: float | datetime | None = None,
    idempotency_key: str | None = None,
) -> AsyncResult:
    """Submit work to ``workflow`` with settings from the environment."""
    return default_client().submit(
        workflow, payload, priority=priority, deadline=deadline, idempotency_key=idempotency_key
    )

"""Submitting routed work and reading its result.

``LanesClient.submit`` validates everything against the catalog before
anything is enqueued; a bad request raises ``InvalidInput`` and leaves no
trace in Redis.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime
from functools import cached_property

import redis
from celery.result import AsyncResult

from lanes.catalog import RoutingTable, open_catalog
from lanes.celery_client import HOSTED_FLEET, MESSAGE_PRIORITY, ROUTE_TASK, make_celery, queue_for
from lanes.errors import InvalidInput, RedisUnavailable
from lanes.namespace import Namespace
from lanes.priority import Priority
from lanes.redis_conn import connect, resolve_redis_url
from lanes.routing.request import RouteRequest, check_payload, parse_deadline
from lanes.routing.trace import TraceStore
from lanes.routing.view import CatalogView
from lanes.settings import Settings, load_settings, mask_url


class LanesClient:
    """Publishes routed work for a catalog and reads results back."""

    def __init__(self, settings: Settings | None = None, *, redis_url: str | None = None) -> None:
        self.settings = settings or load_settings()
        self.engine = open_catalog(self.settings)
        self.catalog = CatalogView(self.engine)
        self._redis_url = redis_url

    # Redis is reached (and the embedded server started) only once something
    # is sent or read, so a refused submit has touched nothing.
    @cached_property
    def redis_url(self) -> str:
        return self._redis_url or resolve_redis_url(self.settings)

    @cached_property
    def redis(self) -> redis.Redis:
        return connect(self.redis_url, timeout=self.settings.redis_timeout_seconds)

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
        request = RouteRequest(
            task_id=str(uuid.uuid4()),
            workflow=workflow,
            payload=check_payload(payload, kind=route.candidates[0].kind, workflow=workflow),
            priority=chosen,
            deadline=parse_deadline(deadline, now=now),
            submitted_at=now,
            idempotency_key=idempotency_key,
        )
        if idempotency_key is not None:
            if not isinstance(idempotency_key, str) or not idempotency_key.strip() or len(idempotency_key) > 200:
                raise InvalidInput(f"idempotency key {idempotency_key!r} must be a non-empty string of <= 200 characters")
            existing = self._claim_key(idempotency_key, request.task_id)
            if existing is not None:
                return self.celery.AsyncResult(existing)
        try:
            self.celery.send_task(
                ROUTE_TASK,
                args=[request.to_message()],
                task_id=request.task_id,
                queue=queue_for(route.fleet or HOSTED_FLEET, chosen),
                priority=MESSAGE_PRIORITY[chosen],
            )
        except Exception as exc:
            if idempotency_key is not None:
                try:
                    self.redis.delete(self._idem_key(idempotency_key))
                except redis.RedisError:
                    pass  # the key expires on its own
            detail = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise RedisUnavailable(
                f"could not enqueue the task: Redis at {mask_url(self.redis_url)} did not answer ({detail}); "
                "check that it runs and LANES_REDIS_URL points at it"
            ) from None
        return self.celery.AsyncResult(request.task_id)

    def _idem_key(self, key: str) -> str:
        return Namespace(self.settings.key_prefix).idempotency(key)

    def _claim_key(self, key: str, task_id: str) -> str | None:
        """Bind the key to this task id, or return the task it is bound to."""
        name = self._idem_key(key)
        try:
            # Twice at most: the bound key may expire between SET NX and GET.
            for _ in range(2):
                if self.redis.set(name, task_id, nx=True, ex=self.settings.idempotency_ttl_seconds):
                    return None
                existing = self.redis.get(name)
                if existing is not None:
                    return existing.decode()
        except redis.ConnectionError as exc:
            raise RedisUnavailable(f"Redis did not answer: {exc}") from exc
        raise RedisUnavailable(f"idempotency key {key!r} could not be bound; try again")

    def result(self, task_id: str) -> dict:
        """State, answer or error, and the routing trace of every attempt."""
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

    def close(self) -> None:
        if "redis" in self.__dict__:
            self.redis.close()
        if "celery" in self.__dict__:
            self.celery.close()
        self.engine.dispose()


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

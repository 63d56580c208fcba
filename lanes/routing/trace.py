"""The routing trace of a task: what every attempt tried, waited and skipped.

Kept in Redis beside the result (one JSON entry per attempt, so Celery
retries add to it) for as long as results are kept.

A walk's :class:`Trace` is one of the listeners the walker reports to (beside
the process-wide observers of the runtime): each attempt and bypass becomes
one step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import redis

from lanes.namespace import Namespace
from lanes.routing.observers import Attempt, BaseObserver, Bypass


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


@dataclass
class Trace(BaseObserver):
    task_id: str
    workflow: str
    priority: str
    attempt: int
    deadline: float | None
    started_at: float
    queued_seconds: float
    steps: list[dict] = field(default_factory=list)
    outcome: str = "running"
    served_by: str | None = None

    def step(self, model: str, pool: str | None, action: str, **detail) -> dict:
        entry = {"model": model, "pool": pool, "action": action, **detail}
        self.steps.append(entry)
        return entry

    def on_attempt(self, attempt: Attempt) -> None:
        detail: dict = {}
        if attempt.wait_seconds is not None:
            detail["wait_ms"] = _ms(attempt.wait_seconds)
        if attempt.outcome == "served":
            detail.update(admitted_at=attempt.admitted_at, call_ms=_ms(attempt.call_seconds),
                          ttft_ms=_ms(attempt.ttft_seconds))
        else:
            detail.update(reason=attempt.reason, status=attempt.status, call_ms=_ms(attempt.call_seconds))
        if attempt.trial is not None:
            detail["breaker_trial"] = True
        if attempt.asked_yield:
            detail["asked_yield"] = True
        self.step(attempt.model, attempt.pool, attempt.outcome, **detail)

    def on_bypass(self, bypass: Bypass) -> None:
        self.step(bypass.model, bypass.pool, "bypass", reason=bypass.reason, **bypass.detail)

    def as_dict(self) -> dict:
        return {
            "task_id": self.task_id,
            "workflow": self.workflow,
            "priority": self.priority,
            "attempt": self.attempt,
            "deadline": self.deadline,
            "started_at": self.started_at,
            "queued_seconds": round(self.queued_seconds, 4),
            "outcome": self.outcome,
            "served_by": self.served_by,
            "steps": self.steps,
        }


class TraceStore:
    def __init__(self, client: redis.Redis, *, prefix: str, ttl_seconds: int) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl = ttl_seconds

    def _key(self, task_id: str) -> str:
        return Namespace(self._prefix).trace(task_id)

    def save(self, trace: Trace) -> None:
        key = self._key(trace.task_id)
        pipe = self._client.pipeline(transaction=False)
        pipe.rpush(key, json.dumps(trace.as_dict()))
        pipe.expire(key, self._ttl)
        pipe.execute()

    def load(self, task_id: str) -> list[dict]:
        return [json.loads(item) for item in self._client.lrange(self._key(task_id), 0, -1)]

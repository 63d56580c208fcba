"""Idempotency keys: repeated submits of one request return one task.

A key is scoped to its workflow (the same key in another workflow is another
request) and bound to the request it first came with, by a fingerprint of the
workflow, payload and priority. The deadline is left out: it is counted from
each submit, so a retry of the same request naturally carries a later one.

The binding is made in two steps so that it never outlives a task that was
never sent: ``claim`` binds the key for a short claim period (the task not yet
sent), ``confirm`` makes it last the idempotency period once the task is in its
queue. A client that dies in between leaves a claim that lapses by itself; a
concurrent submit of the same request waits for the claim to be confirmed or
to lapse, then returns the task or sends its own.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass

import redis

from lanes.errors import InvalidInput, RedisUnavailable
from lanes.namespace import Namespace
from lanes.redis_conn import REDIS_UNAVAILABLE

MAX_KEY_LENGTH = 200
POLL_SECONDS = 0.02


def request_fingerprint(workflow: str, payload: dict, priority: str) -> str:
    canonical = json.dumps({"workflow": workflow, "payload": payload, "priority": priority},
                           sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def check_key(key: object) -> str:
    if not isinstance(key, str) or not key.strip() or len(key) > MAX_KEY_LENGTH:
        raise InvalidInput(f"idempotency key {key!r} must be a non-empty string of <= {MAX_KEY_LENGTH} characters")
    return key


@dataclass(frozen=True)
class Binding:
    task_id: str
    fingerprint: str
    sent: bool

    def dumps(self) -> str:
        return json.dumps({"task_id": self.task_id, "request": self.fingerprint, "sent": self.sent})

    @classmethod
    def loads(cls, raw: bytes) -> "Binding":
        try:
            data = json.loads(raw)
            return cls(task_id=data["task_id"], fingerprint=data["request"], sent=bool(data["sent"]))
        except (ValueError, KeyError, TypeError):
            # Not written by this module (a bare task id): bound, to no request we can match.
            return cls(task_id=raw.decode(errors="replace"), fingerprint="", sent=True)


class IdempotencyKey:
    """One workflow's key, bound in Redis to one request's task."""

    def __init__(self, client: redis.Redis, *, prefix: str, workflow: str, key: str,
                 claim_seconds: float, ttl_seconds: int) -> None:
        self._client = client
        self.workflow = workflow
        self.key = check_key(key)
        self.name = Namespace(prefix).idempotency(key, workflow)
        self._claim_ms = max(1, int(claim_seconds * 1000))
        self._ttl = ttl_seconds

    def claim(self, task_id: str, fingerprint: str) -> str | None:
        """Bind the key to ``task_id`` (not yet sent): None. Or the task of the
        same request the key is already bound to. A different request is refused."""
        mine = Binding(task_id, fingerprint, sent=False).dumps()
        # A pending claim of another submit is waited out: it is confirmed,
        # or it lapses (that submit died before sending) and this one claims.
        give_up = time.monotonic() + 2 * self._claim_ms / 1000 + 1
        try:
            while True:
                if self._client.set(self.name, mine, nx=True, px=self._claim_ms):
                    return None
                raw = self._client.get(self.name)
                if raw is not None:
                    bound = Binding.loads(raw)
                    if bound.fingerprint != fingerprint:
                        raise InvalidInput(
                            f"idempotency key {self.key!r} of workflow {self.workflow!r} was used for a different "
                            f"request (task {bound.task_id}); a new request needs a new key"
                        )
                    if bound.sent:
                        return bound.task_id
                if time.monotonic() > give_up:
                    raise RedisUnavailable(
                        f"idempotency key {self.key!r} stays claimed by another submit that has not sent its task; "
                        "try again"
                    )
                time.sleep(POLL_SECONDS)
        except REDIS_UNAVAILABLE as exc:
            raise RedisUnavailable(f"Redis did not answer: {exc}") from exc

    def confirm(self, task_id: str, fingerprint: str) -> None:
        """The task is queued: keep the binding for the idempotency period."""
        self._replace_if_mine(task_id, Binding(task_id, fingerprint, sent=True).dumps())

    def release(self, task_id: str) -> None:
        """The task could not be sent: free the key at once (if still ours)."""
        self._replace_if_mine(task_id, None)

    def _replace_if_mine(self, task_id: str, value: str | None) -> None:
        with self._client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(self.name)
                raw = pipe.get(self.name)
                if raw is None or Binding.loads(raw).task_id != task_id:
                    return  # our claim lapsed and another submit holds the key now
                pipe.multi()
                if value is None:
                    pipe.delete(self.name)
                else:
                    pipe.set(self.name, value, ex=self._ttl)
                pipe.execute()
            except redis.WatchError:
                return  # changed under us: no longer ours

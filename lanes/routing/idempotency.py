"""Idempotency keys: repeated submits of one request return one task.

A key is scoped to its workflow (the same key in another workflow is another
request) and bound to the request it first came with, by a fingerprint of the
workflow, payload and priority. The deadline is left out: it is counted from
each submit, so a retry of the same request naturally carries a later one.

The binding is made in two steps and names its task id from the start:
``claim`` binds the key to a task id not yet known to be queued, ``confirm``
marks it queued once the publish answered. A binding never confirmed (the
client died before sending, or the publish's reply was lost, so nobody knows
whether the message is queued) is taken over by the next submit with the key
once the claim period has passed: that submit sends the *same* task id. Two
messages with one task id call the backend once (the worker's run lease joins
them, workers/runs.py), so a lost publish reply can never make a key send two
tasks; a concurrent submit of the same request waits for the claim to be
confirmed or to lapse, then returns the task or sends it.
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
    claimed_ms: int = 0  # the Redis server time of the claim (ms)

    def dumps(self) -> str:
        return json.dumps({"task_id": self.task_id, "request": self.fingerprint, "sent": self.sent,
                           "claimed_ms": self.claimed_ms})

    @classmethod
    def loads(cls, raw: bytes) -> "Binding":
        try:
            data = json.loads(raw)
            return cls(task_id=data["task_id"], fingerprint=data["request"], sent=bool(data["sent"]),
                       claimed_ms=int(data.get("claimed_ms") or 0))
        except (ValueError, KeyError, TypeError):
            # Not written by this module (a bare task id): bound, to no request we can match.
            return cls(task_id=raw.decode(errors="replace"), fingerprint="", sent=True)


@dataclass(frozen=True)
class Claim:
    """The task a submit with this key stands for, and whether that submit sends it."""

    task_id: str
    send: bool


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

    def _now_ms(self) -> int:
        seconds, micros = self._client.time()  # the server's clock: every client judges a claim alike
        return int(seconds) * 1000 + int(micros) // 1000

    def claim(self, task_id: str, fingerprint: str) -> Claim:
        """Bind the key to ``task_id``: ``Claim(task_id, send=True)``. Or the task
        the key is bound to: already queued (``send=False``), or left unconfirmed
        past the claim period (``send=True``: this submit sends that same task).
        A different request is refused."""
        # A pending claim of another submit is waited out: it is confirmed,
        # or its claim period passes and this submit sends its task.
        give_up = time.monotonic() + 2 * self._claim_ms / 1000 + 1
        try:
            while True:
                now = self._now_ms()
                mine = Binding(task_id, fingerprint, sent=False, claimed_ms=now).dumps()
                if self._client.set(self.name, mine, nx=True, ex=self._ttl):
                    return Claim(task_id, send=True)
                raw = self._client.get(self.name)
                if raw is not None:
                    bound = Binding.loads(raw)
                    if bound.fingerprint != fingerprint:
                        raise InvalidInput(
                            f"idempotency key {self.key!r} of workflow {self.workflow!r} was used for a different "
                            f"request (task {bound.task_id}); a new request needs a new key"
                        )
                    if bound.sent:
                        return Claim(bound.task_id, send=False)
                    if now - bound.claimed_ms >= self._claim_ms and self._take_over(raw, bound, now):
                        return Claim(bound.task_id, send=True)
                if time.monotonic() > give_up:
                    raise RedisUnavailable(
                        f"idempotency key {self.key!r} stays claimed by another submit that has not sent its task; "
                        "try again"
                    )
                time.sleep(POLL_SECONDS)
        except REDIS_UNAVAILABLE as exc:
            raise RedisUnavailable(f"Redis did not answer: {exc}") from exc

    def _take_over(self, raw: bytes, bound: Binding, now_ms: int) -> bool:
        """Claim an unconfirmed binding for this submit, keeping its task id."""
        renewed = Binding(bound.task_id, bound.fingerprint, sent=False, claimed_ms=now_ms).dumps()
        with self._client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(self.name)
                if pipe.get(self.name) != raw:
                    return False
                pipe.multi()
                pipe.set(self.name, renewed, ex=self._ttl)
                pipe.execute()
                return True
            except redis.WatchError:
                return False

    def confirm(self, task_id: str, fingerprint: str) -> None:
        """The task is queued: keep the binding for the idempotency period."""
        self._replace_if_mine(task_id, Binding(task_id, fingerprint, sent=True).dumps())

    def release(self, task_id: str) -> None:
        """Nothing was sent (refused before publishing): free the key at once (if still ours)."""
        self._replace_if_mine(task_id, None)

    def _replace_if_mine(self, task_id: str, value: str | None) -> None:
        with self._client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(self.name)
                raw = pipe.get(self.name)
                if raw is None or Binding.loads(raw).task_id != task_id:
                    return  # another request's binding (the key expired meanwhile)
                pipe.multi()
                if value is None:
                    pipe.delete(self.name)
                else:
                    pipe.set(self.name, value, ex=self._ttl)
                pipe.execute()
            except redis.WatchError:
                return  # changed under us: no longer ours

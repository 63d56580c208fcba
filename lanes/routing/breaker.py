"""Circuit breakers per backend, shared by every worker through Redis.

A breaker opens after ``consecutive`` failures in a row or when the failure
rate over the last ``window`` outcomes reaches ``failure_rate``; after
``cooldown_seconds`` one half-open trial call is let through, and its outcome
closes or reopens it.

The walker asks twice: :meth:`Breakers.state` before it waits in a lane (read
only: an open breaker is passed over), and :meth:`Breakers.claim` once it holds
a slot, just before calling. Only the claim takes the half-open trial, so a
request that bypasses or times out in the lane never burns it; a claimed trial
that makes no call is given back (:meth:`Breakers.give_back`).

:class:`BreakerObserver` feeds the breakers from the walker's attempts: only
outcomes that say something about the backend's health count. Time that ran
out on our side (a queued task past its deadline, a call cut short by the
caller's deadline) never does.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import redis

from lanes.errors import RedisUnavailable
from lanes.namespace import Namespace
from lanes.redis_conn import REDIS_UNAVAILABLE
from lanes.routing.observers import Attempt, BaseObserver
from lanes.routing.scripts import script_source

log = logging.getLogger("lanes.routing")


@dataclass(frozen=True, kw_only=True)
class BreakerPolicy:
    consecutive: int = 5
    window: int = 50
    min_samples: int = 20
    failure_rate: float = 0.5
    cooldown_seconds: float = 10.0
    trial_seconds: float = 30.0

    def __post_init__(self) -> None:
        if self.consecutive < 1 or self.window < 1 or self.min_samples < 1:
            raise ValueError(f"breaker counts must be >= 1: {self}")
        if not 0 < self.failure_rate <= 1:
            raise ValueError(f"breaker failure_rate must be in (0, 1]: {self.failure_rate}")


@dataclass(frozen=True)
class Claim:
    """The answer to "may I call now?" for a caller that holds a lane slot."""

    state: str  # 'closed', 'trial' or 'open'
    trial: str | None = None  # the owner token when this caller holds the half-open trial

    @property
    def may_call(self) -> bool:
        return self.state != "open"


class Breakers:
    """All backends' breakers on one Redis."""

    def __init__(self, client: redis.Redis, *, prefix: str, policy: BreakerPolicy | None = None) -> None:
        self._client = client
        self._prefix = prefix
        self.policy = policy or BreakerPolicy()
        self._claim = client.register_script(script_source("breaker_claim"))
        self._give_back = client.register_script(script_source("breaker_give_back"))
        self._record = client.register_script(script_source("breaker_record"))

    def _keys(self, backend: str) -> list[str]:
        return list(Namespace(self._prefix).breaker(backend))

    def _run(self, script, what: str, *, keys: list[str], args: list) -> str:
        try:
            result = script(keys=keys, args=args)
        except REDIS_UNAVAILABLE as exc:
            raise RedisUnavailable(f"Redis did not answer the breaker {what}: {exc}") from exc
        return result.decode() if isinstance(result, bytes) else result

    def state(self, backend: str) -> str:
        """'closed', 'half_open' (a trial may be claimed) or 'open'. Changes nothing."""
        return self._run(self._claim, "check", keys=self._keys(backend)[:1], args=[0, ""])

    def allows(self, backend: str) -> bool:
        return self.state(backend) != "open"

    def claim(self, backend: str, *, call_seconds: float = 0.0) -> Claim:
        """Take the right to call, the half-open trial included; hold a lane slot first.

        A trial is kept for the longer of the policy's trial period and the
        call's own timeout (``call_seconds``), so no second trial starts while
        this one may still be running.
        """
        token = uuid.uuid4().hex
        trial_ms = int(max(self.policy.trial_seconds, call_seconds + 1.0) * 1000)
        state = self._run(self._claim, "claim", keys=self._keys(backend)[:1], args=[trial_ms, token])
        return Claim(state, token if state == "trial" else None)

    def give_back(self, backend: str, trial: str) -> bool:
        """Return a claimed trial that made no call; True when it was still ours."""
        return bool(int(self._run(self._give_back, "give-back", keys=self._keys(backend)[:1], args=[trial])))

    def record(self, backend: str, *, ok: bool) -> str:
        p = self.policy
        return self._run(
            self._record,
            "update",
            keys=self._keys(backend),
            args=[
                1 if ok else 0,
                p.consecutive,
                p.window,
                p.min_samples,
                p.failure_rate,
                int(p.cooldown_seconds * 1000),
                int(max(p.cooldown_seconds * 10, 3600) * 1000),
            ],
        )


class BreakerObserver(BaseObserver):
    """Feeds each backend's breaker from the walker's attempts.

    ``served`` closes, a backend fault (``failed``, ``timeout``) counts against
    it; anything else (a lost lease, a request the backend refused as wrong,
    a call cut short by the caller's own deadline) says nothing about the
    backend, and a half-open trial spent on it is given back.
    """

    def __init__(self, breakers: Breakers) -> None:
        self.breakers = breakers

    def on_attempt(self, attempt: Attempt) -> None:
        if attempt.outcome == "served" or attempt.backend_fault:
            self.breakers.record(attempt.model, ok=attempt.outcome == "served")
        elif attempt.trial is not None:
            self.breakers.give_back(attempt.model, attempt.trial)

"""Circuit breakers per backend, shared by every worker through Redis.

A breaker opens after ``consecutive`` failures in a row or when the failure
rate over the last ``window`` outcomes reaches ``failure_rate``; after
``cooldown_seconds`` one half-open trial call is let through, and its outcome
closes or reopens it.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from lanes.errors import RedisUnavailable
from lanes.namespace import Namespace
from lanes.routing.scripts import script_source


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


class Breakers:
    """All backends' breakers on one Redis."""

    def __init__(self, client: redis.Redis, *, prefix: str, policy: BreakerPolicy | None = None) -> None:
        self._client = client
        self._prefix = prefix
        self.policy = policy or BreakerPolicy()
        self._check = client.register_script(script_source("breaker_check"))
        self._record = client.register_script(script_source("breaker_record"))

    def _keys(self, backend: str) -> list[str]:
        return list(Namespace(self._prefix).breaker(backend))

    def state(self, backend: str) -> str:
        """'closed', 'half_open' (this caller holds the one trial) or 'open'."""
        try:
            result = self._check(keys=self._keys(backend)[:1], args=[int(self.policy.trial_seconds * 1000)])
        except redis.ConnectionError as exc:
            raise RedisUnavailable(f"Redis did not answer the breaker check: {exc}") from exc
        return result.decode() if isinstance(result, bytes) else result

    def allows(self, backend: str) -> bool:
        return self.state(backend) != "open"

    def record(self, backend: str, *, ok: bool) -> str:
        p = self.policy
        try:
            result = self._record(
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
        except redis.ConnectionError as exc:
            raise RedisUnavailable(f"Redis did not answer the breaker update: {exc}") from exc
        return result.decode() if isinstance(result, bytes) else result

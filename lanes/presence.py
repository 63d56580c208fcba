"""Which workers are alive, per fleet: a heartbeat each worker keeps in Redis.

Work sent to a fleet with no worker waits in its queue without a word, so
every worker announces itself. Each fleet has one sorted set (named by
:class:`lanes.namespace.Namespace`) of worker names scored by when their entry
expires, in Redis server time so that clocks of different machines never
matter. A worker renews its entry every third of the time to live and removes
it when it stops; a crashed worker drops out when its entry expires.
"""

from __future__ import annotations

import redis

from lanes.errors import RedisUnavailable
from lanes.namespace import Namespace
from lanes.redis_conn import REDIS_UNAVAILABLE

HEARTBEAT_TTL_SECONDS = 30.0


class WorkerPresence:
    def __init__(self, client: redis.Redis, *, prefix: str, ttl_seconds: float = HEARTBEAT_TTL_SECONDS) -> None:
        self._client = client
        self._names = Namespace(prefix)
        self.ttl_seconds = ttl_seconds

    @property
    def interval_seconds(self) -> float:
        return self.ttl_seconds / 3

    def _now(self) -> float:
        seconds, micros = self._client.time()
        return seconds + micros / 1e6

    def beat(self, fleet: str, worker: str) -> None:
        """Say ``worker`` of ``fleet`` is alive for the next time to live."""
        key = self._names.workers(fleet)
        now = self._now()
        pipe = self._client.pipeline(transaction=False)
        pipe.zadd(key, {worker: now + self.ttl_seconds})
        pipe.zremrangebyscore(key, "-inf", now)  # crashed workers' entries
        # The set outlives its last worker by a little, then goes by itself.
        pipe.expire(key, int(self.ttl_seconds * 2) + 1)
        pipe.execute()

    def leave(self, fleet: str, worker: str) -> None:
        self._client.zrem(self._names.workers(fleet), worker)

    def live(self, fleet: str) -> list[str]:
        return self.live_by_fleet([fleet])[fleet]

    def live_by_fleet(self, fleets: list[str]) -> dict[str, list[str]]:
        """Live worker names of each fleet, sorted."""
        try:
            now = self._now()
            pipe = self._client.pipeline(transaction=False)
            for fleet in fleets:
                pipe.zrangebyscore(self._names.workers(fleet), f"({now}", "+inf")
            replies = pipe.execute()
        except REDIS_UNAVAILABLE as exc:
            raise RedisUnavailable(f"Redis did not answer: {exc}") from exc
        return {fleet: sorted(m.decode() for m in members) for fleet, members in zip(fleets, replies)}

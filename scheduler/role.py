"""Which beat is the active one: a Redis lock, requested once per loop, never blocking.

A beat is **active** only while a lock request of this loop succeeded: it
took the free lock, or renewed the one it holds. Anything else leaves it a
**standby**: the lock held by another beat, the lock it held gone (expired
while it was paused, or Redis lost it), or Redis not answering at all. A
failed request never counts as success, and never ends the process: the
next loop asks again, so a beat outlives a Redis outage and comes back in
whichever role the lock then gives it. A beat that was active keeps its
token through an outage: if Redis kept the lock and it has not lapsed, the
first request after the outage renews it and the same beat carries on.
"""

from __future__ import annotations

import logging

import redis
from redis.exceptions import LockError

log = logging.getLogger("lanes.scheduler")


class BeatRole:
    def __init__(self, client: redis.Redis, *, key: str, timeout_seconds: float, owner: str) -> None:
        self.client = client
        self.key = key
        self.timeout_seconds = timeout_seconds
        self.owner = owner
        self._lock = None  # the redis-py Lock whose token we hold, if any
        self.active = False
        self._unreachable = False

    def request(self) -> bool:
        """One lock request (renew when held, take when free); True when this beat is active now."""
        try:
            if self._lock is not None and self._renew():
                return self._became(True)
            lock = self.client.lock(self.key, timeout=self.timeout_seconds, thread_local=False)
            if lock.acquire(blocking=False):
                self._lock = lock
                return self._became(True)
            return self._became(False)
        except (redis.RedisError, OSError) as exc:
            if not self._unreachable:
                log.warning("beat %s: Redis did not answer the lock request (%s); standing by until it does",
                            self.owner, _first_line(exc))
            self._unreachable = True
            self.active = False
            return False

    def _renew(self) -> bool:
        try:
            self._lock.extend(self.timeout_seconds, replace_ttl=True)
            return True
        except LockError:  # not ours any more: it lapsed or Redis lost it
            log.warning("beat %s: the beat lock is no longer ours", self.owner)
            self._lock = None
            return False

    def _became(self, active: bool) -> bool:
        if self._unreachable:
            log.warning("beat %s: Redis answers again; %s", self.owner, "active" if active else "standing by")
            self._unreachable = False
        self.active = active
        return active

    def release(self) -> None:
        """Best effort at shutdown: a lock left behind lapses on its own."""
        if self._lock is None:
            return
        try:
            self._lock.release()
        except (redis.RedisError, LockError, OSError):
            pass
        self._lock = None
        self.active = False


def _first_line(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)

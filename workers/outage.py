"""Riding out outages: Redis gone mid-walk, and backends all failing for a while.

Two things a routed task does instead of ending when the trouble is passing:

- **Redis went away** during a lane wait or a call (the walk ended in
  ``RedisUnavailable``): the task waits in its worker for Redis to answer
  again, within its deadline (or ``LANES_REDIS_OUTAGE_SECONDS`` without one),
  then walks once more in the same delivery. Handing it back instead would
  need the very Redis that is away (a requeue onto a dead connection is how
  such tasks vanished). The re-walk may call a candidate whose call the
  outage cut short once more; it is the only one.
- **Every candidate failed with a retryable answer** (5xx, 429, 529, no
  answer, a timeout) or was passed over for an open breaker: background work
  is sent back to its queue with backoff (``LANES_BACKGROUND_RETRY_SECONDS``
  doubling up to ``LANES_BACKGROUND_RETRY_CAP_SECONDS``), within its deadline
  or ``LANES_BACKGROUND_RETRY_HORIZON_SECONDS`` from its submit, so a primary
  down for minutes no longer fails a whole backlog at once. Interactive and
  user-tool work keep failing fast within their deadlines.
"""

from __future__ import annotations

import logging
import threading
import time

from lanes.priority import Priority
from lanes.redis_conn import REDIS_UNAVAILABLE
from lanes.routing.request import RouteRequest
from lanes.settings import Settings

log = logging.getLogger("lanes.worker")

# HTTP answers that say "not now" rather than "never": worth calling again later.
RETRYABLE_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504, 529})
# Walk outcomes that answered nothing final (``rejected`` is a 4xx: the request's fault).
RETRYABLE_OUTCOMES = frozenset({"failed", "timeout", "abandoned", "lease_lost", "yielded", "bypass"})


def redis_patience(settings: Settings, request: RouteRequest, now: float) -> float:
    """How long a task may wait for its Redis to come back: within its deadline."""
    if request.deadline is None:
        return settings.redis_outage_seconds
    return max(0.0, min(settings.redis_outage_seconds, request.deadline - now - 1.0))


def wait_for_redis(ping, patience: float, cancel: threading.Event | None = None) -> bool:
    """Ping until Redis answers (True) or ``patience`` seconds pass (False)."""
    give_up = time.monotonic() + patience
    pause = 0.1
    while True:
        try:
            ping()
            return True
        except REDIS_UNAVAILABLE:
            pass
        left = give_up - time.monotonic()
        if left <= 0 or (cancel is not None and cancel.is_set()):
            return False
        time.sleep(min(pause, left))
        pause = min(2.0, pause * 2)


def all_retryable(steps: list[dict]) -> bool:
    """Whether every step of a walk that ended without an answer may succeed later."""
    if not steps:
        return False
    for step in steps:
        if step.get("action") not in RETRYABLE_OUTCOMES:
            return False
        status = step.get("status")
        if status is not None and int(status) not in RETRYABLE_STATUSES:
            return False
    return True


def background_retry_countdown(settings: Settings, request: RouteRequest, steps: list[dict],
                               redis_lost: bool, now: float) -> float | None:
    """Seconds until a background task whose candidates all failed retryably runs
    again, or None when it must fail now (not background, a final answer among
    its failures, or its deadline or horizon leaves no room)."""
    if request.priority is not Priority.BACKGROUND:
        return None
    if not redis_lost and not all_retryable(steps):
        return None
    countdown = min(settings.background_retry_cap_seconds,
                    settings.background_retry_seconds * 2.0 ** request.outage_retries)
    if request.deadline is not None:
        return countdown if request.deadline - now > countdown + 1.0 else None
    if now + countdown - request.submitted_at > settings.background_retry_horizon_seconds:
        return None
    return countdown

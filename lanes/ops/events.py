"""Reading the routing event log (``lanes events``, ``GET /v1/events``)."""

from __future__ import annotations

import math
import time

from lanes.errors import InvalidInput
from lanes.ops.pools import redis_errors
from lanes.routing.events import EventLog

MAX_LIMIT = 10_000


def list_events(client, *, kind: str | None = None, pool: str | None = None, workflow: str | None = None,
                since: float | None = None, limit: int = 50) -> list[dict]:
    """Events newest first; ``since`` is a number of seconds back from now."""
    if since is not None and (isinstance(since, bool) or not math.isfinite(since) or since <= 0):
        raise InvalidInput(f"since {since!r} is not a number of seconds > 0")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"limit {limit!r} is not a whole number within 1..{MAX_LIMIT}")
    log = EventLog(client.redis, prefix=client.settings.key_prefix)
    with redis_errors():
        events = log.list(kind=kind, pool=pool, workflow=workflow,
                          since=None if since is None else time.time() - since, limit=limit)
    return [event.as_dict() for event in events]

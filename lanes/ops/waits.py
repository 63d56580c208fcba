"""Lane waits per pool and priority over a recent window: p50 and p95.

Read from the routing event log (one ``lane_wait`` event per admission, with
its priority and wait), so every worker's admissions count, and a wait of an
hour ago never colours an idle lane's figure: what ``lanes top`` and Flower's
Lanes page show beside the lane's own all-time figures.
"""

from __future__ import annotations

import math
import time

from lanes.ops.pools import redis_errors
from lanes.priority import Priority
from lanes.routing.events import EventLog

WINDOW_SECONDS = 300.0
SCAN_LIMIT = 50_000


def percentile(values: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile of ``values`` (None for none)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def summarise(waits: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, dict]]:
    """``{pool: {priority: {count, p50_ms, p95_ms}}}`` from the waits (ms) each pool and priority had."""
    out = {}
    for pool, by_priority in waits.items():
        out[pool] = {}
        for p in Priority:
            values = by_priority.get(p.label, [])
            out[pool][p.label] = {"count": len(values), "p50_ms": percentile(values, 0.50),
                                  "p95_ms": percentile(values, 0.95)}
    return out


def recent_waits(redis_client, *, prefix: str, window: float = WINDOW_SECONDS,
                 now: float | None = None) -> dict[str, dict[str, dict]]:
    """Each pool's lane waits of the last ``window`` seconds, per priority (pools with none are absent)."""
    now = time.time() if now is None else now
    log = EventLog(redis_client, prefix=prefix, enabled=False)
    with redis_errors():
        events = log.list(kind="lane_wait", since=now - window, limit=SCAN_LIMIT, scan_limit=SCAN_LIMIT)
    waits: dict[str, dict[str, list[float]]] = {}
    for event in events:
        wait_ms, priority = event.detail.get("wait_ms"), event.detail.get("priority")
        if event.pool and priority and isinstance(wait_ms, (int, float)):
            waits.setdefault(event.pool, {}).setdefault(priority, []).append(float(wait_ms))
    return summarise(waits)

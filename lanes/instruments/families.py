"""The process counters, histograms and gauges of Lanes, on prometheus_client's default registry.

Created on first use (:func:`instruments`), never at import, and once per
process: every module that counts something asks for the same objects, and
every exposition of the default registry (a worker's port, the API's
``/metrics``) shows them. Label values are bounded by the catalog and by the
enums below; never a task id, a chat id or a URL.

In a process started with ``PROMETHEUS_MULTIPROC_DIR`` (a fleet worker under
its supervisor, see :mod:`lanes.metrics.exposition`) prometheus_client keeps
the values in files of that folder, and the gauges below say how the values
of several processes combine.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram

from lanes.priority import Priority

PRIORITIES = tuple(p.label for p in Priority)
STATUS_CLASSES = ("2xx", "4xx", "5xx", "timeout", "yielded", "error")
DIRECTIONS = ("up", "down")
# The reasons a routed task goes back to its queue (workers/app.py, workers/memory/worker.py).
RETRY_REASONS = ("candidates_exhausted", "redis_unavailable", "requeued", "duplicate_delivery", "shutdown",
                 "memory_attempt_failed", "capacity_timeout")
# Why a shutdown hand-back may have lost a message (workers/handback.py).
HANDBACK_LOSS_REASONS = ("reply_unread", "reply_unanswered")

# Lane waits run from 0 (a free slot) to the admission cap (300 s by default).
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# 10 s is the default latency budget of the failover share (seed 003): an exact edge.
FIRST_TOKEN_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0)


@dataclass(frozen=True)
class Instruments:
    lane_wait_seconds: Histogram
    lane_hold_seconds: Histogram
    queue_wait_seconds: Histogram
    lane_timeouts_total: Counter
    lane_cancellations_total: Counter
    bypasses_total: Counter
    backend_requests_total: Counter
    retries_total: Counter
    first_token_seconds: Histogram
    width_changes_total: Counter
    memory_gate_engaged: Gauge
    memory_gate_usage_ratio: Gauge
    memory_runs_total: Counter
    events_dropped_total: Counter
    handback_possibly_lost_total: Counter


def _create() -> Instruments:
    return Instruments(
        lane_wait_seconds=Histogram(
            "lanes_lane_wait_seconds", "Admission wait in a lane (0 for a free slot), by priority",
            ["pool", "priority"], buckets=WAIT_BUCKETS),
        queue_wait_seconds=Histogram(
            "lanes_queue_wait_seconds",
            "The whole wait from submit to a request's first call (broker and lane), by priority",
            ["pool", "priority"], buckets=WAIT_BUCKETS),
        lane_hold_seconds=Histogram(
            "lanes_lane_hold_seconds", "How long a granted slot was held (the backend call)",
            ["pool"], buckets=HOLD_BUCKETS),
        lane_timeouts_total=Counter(
            "lanes_lane_timeouts_total", "Lane waits that ended without a slot at their time limit",
            ["pool", "priority"]),
        lane_cancellations_total=Counter(
            "lanes_lane_cancellations_total", "Lane waits cancelled (task revoked, worker shutting down)",
            ["pool"]),
        bypasses_total=Counter(
            "lanes_bypasses_total", "Candidates passed over without a call, by reason",
            ["workflow", "model", "reason"]),
        backend_requests_total=Counter(
            "lanes_backend_requests_total", "Backend calls by how they ended (status class)",
            ["pool", "model", "status_class"]),
        retries_total=Counter(
            "lanes_retries_total", "Routed tasks sent back to their queue, by reason and last HTTP status",
            ["pool", "reason", "status_code"]),
        first_token_seconds=Histogram(
            "lanes_first_token_seconds", "Time to the first token (an embedding's answer) of served calls",
            ["pool", "model"], buckets=FIRST_TOKEN_BUCKETS),
        width_changes_total=Counter(
            "lanes_width_changes_total", "Lane width changes made by this process, by controller and direction",
            ["pool", "controller", "direction"]),
        # livemax: across a supervisor's worker processes, the live one that is most engaged.
        memory_gate_engaged=Gauge(
            "lanes_memory_gate_engaged", "1 while this worker's memory gate holds its consumers off",
            multiprocess_mode="livemax"),
        memory_gate_usage_ratio=Gauge(
            "lanes_memory_gate_usage_ratio", "This worker's memory working set over its cgroup limit",
            multiprocess_mode="livemax"),
        memory_runs_total=Counter(
            "lanes_memory_runs_total", "Memory runs that entered each status", ["status"]),
        events_dropped_total=Counter(
            "lanes_events_dropped_total",
            "Routing events dropped unwritten because Redis could not take them in time (the buffer was full)"),
        handback_possibly_lost_total=Counter(
            "lanes_handback_possibly_lost_total",
            "Messages a shutdown hand-back may have lost: a pending BRPOP's reply that could not be read "
            "(reply_unread) or did not come (reply_unanswered)", ["reason"]),
    )


_lock = threading.Lock()
_instruments: Instruments | None = None


def instruments() -> Instruments:
    """This process's instruments, created on the default registry at first call."""
    global _instruments
    if _instruments is None:
        with _lock:
            if _instruments is None:
                _instruments = _create()
    return _instruments


def status_class(status: int | None, outcome: str) -> str:
    """The bounded class of a backend call's end: 2xx/4xx/5xx, timeout, yielded (its slot
    given to urgent work), or error (no HTTP answer)."""
    if outcome in ("timeout", "abandoned"):
        return "timeout"
    if outcome == "yielded":
        return "yielded"
    if status is None and outcome == "served":
        return "2xx"
    for low, name in ((200, "2xx"), (400, "4xx"), (500, "5xx")):
        if status is not None and low <= status < low + 100:
            return name
    return "error"

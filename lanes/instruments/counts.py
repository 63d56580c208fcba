"""What the rest of Lanes counts outside the walker: width changes, retries,
the memory gate, memory runs, dropped routing events and hand-backs that may
have lost a message. Each is one call at the place the thing
happens; none raises (a metric must never fail the work it counts).
"""

from __future__ import annotations

from lanes.instruments.families import instruments


def width_changed(pool: str, controller: str, old: int, new: int) -> None:
    """A lane's width was moved by this process (``controller``: the controller kind, or what decided)."""
    if new != old:
        instruments().width_changes_total.labels(pool, controller or "unknown", "up" if new > old else "down").inc()


def retried(pool: str, reason: str, status: int | None) -> None:
    """A routed task was sent back to its queue (seed 000: reason and last HTTP status, "" for none)."""
    instruments().retries_total.labels(pool, reason, "" if status is None else str(status)).inc()


def retried_walk(steps: list[dict], reason: str, fallback_pool: str = "") -> None:
    """A task retried after a walk with these trace ``steps``: counted under the pool
    of its last step that had one (else ``fallback_pool``) and the last HTTP status
    it got, so an upstream 529 is told from a quota's 429."""
    status = next((s["status"] for s in reversed(steps) if s.get("status") is not None), None)
    pool = next((s["pool"] for s in reversed(steps) if s.get("pool")), None)
    retried(pool or fallback_pool, reason, status)


def memory_gate(engaged: bool, ratio: float | None) -> None:
    m = instruments()
    m.memory_gate_engaged.set(1 if engaged else 0)
    if ratio is not None:
        m.memory_gate_usage_ratio.set(ratio)


def memory_runs(status: str, count: int = 1) -> None:
    """``count`` memory runs entered ``status`` (queued, running, done, failed)."""
    if count > 0:
        instruments().memory_runs_total.labels(status).inc(count)


def events_dropped(count: int) -> None:
    """``count`` routing events were dropped unwritten (lanes.routing.events)."""
    if count > 0:
        instruments().events_dropped_total.inc(count)


def handback_possibly_lost(reason: str) -> None:
    """A shutdown hand-back may have lost a message (workers/handback.py; reason: HANDBACK_LOSS_REASONS)."""
    instruments().handback_possibly_lost_total.labels(reason).inc()

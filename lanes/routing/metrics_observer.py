"""The walker's reports as process metrics: one more entry in ``Runtime.observers``.

From each :class:`Attempt` (a backend call): the admission wait of the slot
it held, how long it held it, the call's status class, and the first-token
time of a served call. From each :class:`Bypass`: the reason a candidate was
passed over. From each :class:`WaitEnd`: lane waits that timed out or were
cancelled. A model without a pool (a hosted API) is counted with ``pool=""``.
"""

from __future__ import annotations

from lanes.instruments import instruments, status_class
from lanes.routing.observers import Attempt, BaseObserver, Bypass, WaitEnd


def lane_of(attempt: Attempt) -> str:
    return f"hosted:{attempt.model}"


class MetricsObserver(BaseObserver):
    def __init__(self) -> None:
        self.m = instruments()

    def on_attempt(self, attempt: Attempt) -> None:
        m, pool = self.m, attempt.pool or ""
        m.backend_requests_total.labels(pool, attempt.model, status_class(attempt.status, attempt.outcome)).inc()
        if attempt.pool is not None:
            if attempt.wait_seconds is not None:
                m.lane_wait_seconds.labels(pool, attempt.priority.label).observe(attempt.wait_seconds)
            if attempt.call_seconds is not None:
                m.lane_hold_seconds.labels(pool).observe(attempt.call_seconds)
        if attempt.queue_wait_seconds is not None:
            m.queue_wait_seconds.labels(attempt.pool or lane_of(attempt), attempt.priority.label).observe(
                attempt.queue_wait_seconds)
        if attempt.outcome == "served" and attempt.ttft_seconds is not None:
            m.first_token_seconds.labels(pool, attempt.model).observe(attempt.ttft_seconds)

    def on_bypass(self, bypass: Bypass) -> None:
        self.m.bypasses_total.labels(bypass.workflow, bypass.model, bypass.reason).inc()

    def on_wait_end(self, wait: WaitEnd) -> None:
        if wait.outcome == "timeout":
            self.m.lane_timeouts_total.labels(wait.pool, wait.priority.label).inc()
        elif wait.outcome == "cancelled":
            self.m.lane_cancellations_total.labels(wait.pool).inc()

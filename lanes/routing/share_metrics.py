"""Prometheus metrics of the failover share (names from the issue-13 contract).

On prometheus_client's default registry, so every exposition of the process
shows them. Created on first use (never at import) and once per process: a
second registration of the same name would be refused by the registry.
Labels are workflow names only (bounded by the catalog). The gauges show
the latest value of any live process under a fleet supervisor's
multiprocess exposition (``livemax``): they mirror state kept in Redis.

The share itself (``lanes_failover_share``) is read from Redis by the lane
collector (:mod:`lanes.metrics.collector`), like the other lane gauges, so
every process shows the same value.
"""

from __future__ import annotations

import threading

from prometheus_client import Counter, Gauge, Histogram

# An exact 10 s edge: the default latency budget, so "over budget" is a bucket boundary.
FIRST_TOKEN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0)

_lock = threading.Lock()
_instance: "ShareMetrics | None" = None


class ShareMetrics:
    def __init__(self) -> None:
        self.window_samples = Gauge("lanes_failover_window_samples",
                                    "healthy/breach outcomes in the failover share's window", ["workflow"],
                                    multiprocess_mode="livemax")
        self.breach_rate = Gauge("lanes_failover_breach_rate",
                                 "breach rate of the failover share's window", ["workflow"],
                                 multiprocess_mode="livemax")
        self.active_gauge = Gauge("lanes_failover_active",
                                  "1 while the workflow's failover share runs (0 parked or off)", ["workflow"],
                                  multiprocess_mode="livemax")
        self.unknown_total = Counter("lanes_failover_unknown_outcomes",
                                     "primary attempts with an unknown outcome (excluded from the rate)",
                                     ["workflow"])
        self.first_token_seconds = Histogram("lanes_failover_first_token_seconds",
                                             "first-token time of primary attempts (uncensored samples only)",
                                             ["workflow"], buckets=FIRST_TOKEN_BUCKETS)

    def update(self, workflow: str, update) -> None:
        self.window_samples.labels(workflow).set(update.samples)
        self.breach_rate.labels(workflow).set(update.breach_rate or 0.0)
        self.active_gauge.labels(workflow).set(1)

    def active(self, workflow: str, active: bool) -> None:
        self.active_gauge.labels(workflow).set(1 if active else 0)

    def unknown(self, workflow: str) -> None:
        self.unknown_total.labels(workflow).inc()

    def first_token(self, workflow: str, seconds: float) -> None:
        self.first_token_seconds.labels(workflow).observe(seconds)


def share_metrics() -> ShareMetrics:
    """The process's one set of share metrics."""
    global _instance
    with _lock:
        if _instance is None:
            _instance = ShareMetrics()
        return _instance

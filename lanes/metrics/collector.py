"""Lane gauges read from Redis at scrape time, so every process that exposes
metrics shows the same lanes, whichever worker admitted the work.

For every pool of the catalog: the width the lane admits now, the width
written in the catalog, the holders in flight, the waiters per priority, and
the lane's own grant and expired-lease counters (kept in Redis by the lane
scripts, so they count every worker's grants). For every model: its
breaker's state. For every workflow whose failover share runs: the share
(seed 003; 1.0 before its first request). And the number of mismatches the
last lane-config check found (no sample before a check has run).

A scrape reads one lane script per pool and one breaker check per model; the
reading is kept for ``cache_seconds`` (2 s) so that several scrapers, or a
dashboard refreshing fast, cost Redis one reading. When Redis or the catalog
does not answer, the scrape still succeeds with the process metrics and
these families empty (the failure is logged, at most once a minute), and
``lanes_lane_collector_up`` says 0: an empty family cannot fire an alert, so
without it every lane alert would go quiet exactly while Redis is away
(deploy/prometheus/rules/lanes.yml alerts on it).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Callable, Iterable

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lanes.catalog import RoutingTable
from lanes.celery_client import broker_client, broker_queued
from lanes.namespace import Namespace
from lanes.routing.breaker import Breakers
from lanes.routing.share import ShareStore
from lanes.routing.share import eligible as share_eligible
from lanes.settings import Settings

log = logging.getLogger("lanes.metrics")

BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}
WARN_EVERY_SECONDS = 60.0


def _families() -> dict[str, Metric]:
    return {
        "width": GaugeMetricFamily("lanes_lane_width", "Width the lane admits now (slots)", labels=["pool"]),
        "configured": GaugeMetricFamily(
            "lanes_lane_configured_width", "Width written in the catalog", labels=["pool"]),
        "in_flight": GaugeMetricFamily("lanes_lane_in_flight", "Slots held now", labels=["pool"]),
        "broker_queued": GaugeMetricFamily(
            "lanes_broker_queued", "Requests of the pool's fleet not yet taken by a worker, by priority",
            labels=["pool", "priority"]),
        "queued": GaugeMetricFamily(
            "lanes_lane_queued", "Requests waiting in the lane, by priority", labels=["pool", "priority"]),
        "grants": CounterMetricFamily(
            "lanes_lane_grants", "Slots granted by the lane (every worker's), since its state was created",
            labels=["pool"]),
        "expired": CounterMetricFamily(
            "lanes_lane_expired_leases", "Holders whose lease lapsed (a worker died or lost Redis)",
            labels=["pool"]),
        "breaker": GaugeMetricFamily(
            "lanes_breaker_state", "Breaker of a model: 0 closed, 1 half-open, 2 open", labels=["model"]),
        "mismatches": GaugeMetricFamily(
            "lanes_lane_config_mismatches", "Mismatches the last lane-config check found"),
        "share": GaugeMetricFamily(
            "lanes_failover_share", "Fraction of a workflow's requests that try its primary first (seed 003)",
            labels=["workflow"]),
        "up": GaugeMetricFamily(
            "lanes_lane_collector_up",
            "1 when the last reading of the lanes from Redis and the catalog succeeded, 0 when it failed"),
    }


class LaneCollector(Collector):
    """A custom collector: register it once per process (``lanes.metrics.install``)."""

    def __init__(self, settings: Settings, client: redis.Redis, table: Callable[[], RoutingTable], *,
                 cache_seconds: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.client = client
        self.table = table
        self.cache_seconds = cache_seconds
        self.clock = clock
        self.breakers = Breakers(client, prefix=settings.key_prefix)
        self.names = Namespace(settings.key_prefix)
        self.shares = ShareStore(client, self.names)
        self._lock = threading.Lock()
        self._cached: list[Metric] | None = None
        self._read_at = float("-inf")
        self._warned_at = float("-inf")
        self.readings = 0  # how many times Redis was read (the cache's effect is testable)

    def describe(self) -> Iterable[Metric]:
        # Registering asks for the names: answer without touching Redis.
        return list(_families().values())

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            now = self.clock()
            if self._cached is None or now - self._read_at >= self.cache_seconds:
                self._cached = self._read()
                self._read_at = now
            return list(self._cached)

    def _read(self) -> list[Metric]:
        families = _families()
        try:
            self._fill(families)
            up = 1
        except Exception as exc:  # noqa: BLE001 - a scrape must answer with what it has
            families = _families()  # nothing half-read: a partial lane list would look like fewer pools
            up = 0
            now = self.clock()
            if now - self._warned_at >= WARN_EVERY_SECONDS:
                self._warned_at = now
                log.warning("lane metrics not read: %s", exc)
        families["up"].add_metric([], up)
        self.readings += 1
        return list(families.values())

    def _fill(self, f: dict[str, Metric]) -> None:
        # Here, not at the top: lanes.pools counts width changes through this package.
        from lanes.pools import pool_lane

        table = self.table()
        for pool in sorted(table.pools.values(), key=lambda p: p.name):
            f["configured"].add_metric([pool.name], pool.width)
            stats = pool_lane(self.client, self.settings, pool).stats()
            if not stats.exists:
                continue  # a lane with no state yet (or coming back from a loss): nothing live to show
            f["width"].add_metric([pool.name], stats.width)
            f["in_flight"].add_metric([pool.name], stats.in_flight)
            for priority, count in stats.queued.items():
                f["queued"].add_metric([pool.name, priority.label], count)
            for priority, count in broker_queued(broker_client(self.settings, self.client), pool.name).items():
                f["broker_queued"].add_metric([pool.name, priority.label], count)
            f["grants"].add_metric([pool.name], stats.grants)
            f["expired"].add_metric([pool.name], stats.expired)
        for model in sorted(table.models):
            f["breaker"].add_metric([model], BREAKER_STATES.get(self.breakers.state(model), 2))
        for name, route in sorted(table.workflows.items()):
            if share_eligible(route):
                f["share"].add_metric([name], self.shares.share(name))
        raw = self.client.get(self.names.lane_config)
        if raw:
            f["mismatches"].add_metric([], len(json.loads(raw).get("mismatches", [])))

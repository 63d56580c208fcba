"""Reading vLLM's Prometheus gauges for one pool: every backend, the pool's models only.

The metrics URL of a backend is its ``base_url`` without a trailing ``/v1``
plus ``/metrics``; the pool's ``metrics_url`` overrides it. Samples are
selected by the ``model_name`` label (one vLLM may serve several models, and
the simulator serves all of its models on one port) and summed across the
backends, as replicas add up. Scrapes are throttled (``scrape_seconds``) and
short (``timeout_seconds``). Any failure (no answer, an error status, text
that is not the exposition format, no sample of the pool's models) makes
the result ``ok=False``, and so does a last good scrape older than
``stale_seconds``: the laws never grow on it.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from lanes.catalog import PoolInfo, RoutingTable
from lanes.control.laws import Gauges

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
BY_REASON = "vllm:num_requests_waiting_by_reason"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # current, then before vLLM 0.9.2


def metrics_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base + "/metrics"


def targets(pool: PoolInfo, table: RoutingTable) -> tuple[list[str], set[str]]:
    """(metrics URLs to scrape, model names to select) for ``pool``."""
    models = [m for m in table.models.values() if m.pool is not None and m.pool.id == pool.id]
    names = {m.name for m in models}
    if pool.metrics_url:
        return [pool.metrics_url], names
    return sorted({metrics_url(m.base_url) for m in models}), names


def parse(text: str, models: set[str]) -> Gauges:
    """Sum the gauges of ``models`` in one exposition text (raises ValueError on garbage)."""
    running = waiting = 0.0
    capacity: float | None = None
    kv: float | None = None
    seen = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model_name") not in models:
                continue
            if sample.name == RUNNING:
                running += sample.value
                seen = True
            elif sample.name == WAITING:
                waiting += sample.value
            elif sample.name == BY_REASON and sample.labels.get("reason") == "capacity":
                capacity = (capacity or 0.0) + sample.value
            elif sample.name in KV_USAGE:
                kv = sample.value if kv is None else max(kv, sample.value)
    if not seen:
        raise ValueError(f"no {RUNNING} sample for model(s) {', '.join(sorted(models))}")
    return Gauges(ok=True, running=running, waiting=waiting, waiting_capacity=capacity, kv_usage=kv)


def scrape(urls: list[str], models: set[str], *, timeout: float, client: httpx.Client | None = None) -> Gauges:
    """One scrape of every URL, summed; ``ok=False`` with the reason on any failure."""
    if not urls or not models:
        return Gauges(ok=False, error="the pool has no backend to scrape")
    own = client is None
    client = client or httpx.Client(timeout=timeout)
    try:
        parts = []
        for url in urls:
            try:
                response = client.get(url, timeout=timeout)
                response.raise_for_status()
                parts.append(parse(response.text, models))
            except (httpx.HTTPError, ValueError) as exc:
                return Gauges(ok=False, error=f"{url}: {exc}")
    finally:
        if own:
            client.close()
    capacities = [p.waiting_capacity for p in parts if p.waiting_capacity is not None]
    kvs = [p.kv_usage for p in parts if p.kv_usage is not None]
    return Gauges(
        ok=True,
        running=sum(p.running for p in parts),
        waiting=sum(p.waiting for p in parts),
        waiting_capacity=sum(capacities) if len(capacities) == len(parts) else None,
        kv_usage=sum(kvs) / len(kvs) if kvs else None,
    )


class Scraper:
    """One pool's throttled scrapes: a fresh reading at most every ``scrape_seconds``."""

    def __init__(self, *, client: httpx.Client | None = None) -> None:
        self.client = client or httpx.Client()
        self.last_at: float | None = None
        self.last_good_at: float | None = None
        self.last: Gauges | None = None
        self.urls: list[str] = []

    def due(self, now: float, every: float) -> bool:
        return self.last_at is None or now - self.last_at >= every

    def read(self, pool: PoolInfo, table: RoutingTable, now: float, *, every: float, timeout: float,
             stale: float) -> Gauges | None:
        """A fresh reading when one is due, else None (a stale good reading counts as failed)."""
        if not self.due(now, every):
            if self.last_good_at is not None and now - self.last_good_at > stale:
                return Gauges(ok=False, error=f"last good scrape {now - self.last_good_at:.0f}s old")
            return None
        self.urls, models = targets(pool, table)
        gauges = scrape(self.urls, models, timeout=timeout, client=self.client)
        self.last_at, self.last = now, gauges
        if gauges.ok:
            self.last_good_at = now
        return gauges

    def snapshot(self) -> dict:
        g = self.last
        return {
            "urls": self.urls,
            "last_poll": self.last_at,
            "metrics_ok": bool(g and g.ok),
            "running": g.running if g else None,
            "waiting": g.waiting if g else None,
            "waiting_capacity": g.waiting_capacity if g else None,
            "kv_usage": g.kv_usage if g else None,
            "error": g.error if g else None,
        }

    def close(self) -> None:
        self.client.close()

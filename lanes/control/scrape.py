"""Reading vLLM's metrics for one pool: every endpoint apart, the pool's models only.

Which endpoints: the pool's listed ``endpoints`` (its replicas, each a base
URL; see docs/CATALOG.md), else its ``metrics_url``, else each model's
``base_url``. An endpoint's metrics URL is its base URL without a trailing
``/v1`` plus ``/metrics``. Samples are selected by the ``model_name`` label
(one vLLM may serve several models) and summed over the endpoints, as
replicas add up.

Each endpoint is judged apart (as the Gateway API Inference Extension
does): one that fails a scrape (no answer in ``timeout_seconds``, an error
status, text that is not the exposition format, no sample of the pool's
models) is left out of the sums, and the reading says so (``fresh`` of
``endpoints``, with the width ``held`` for the missing ones, which the
loop supplies). Only when no endpoint answers is the reading failed
(``ok=False``); the laws then hold the last good width.

Latency histograms (inter-token, time to first token) are kept per endpoint
as their growth between the endpoint's last two good scrapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from lanes.catalog import PoolInfo, RoutingTable
from lanes.control import histograms
from lanes.control.laws import Gauges

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
BY_REASON = "vllm:num_requests_waiting_by_reason"  # first released in vLLM 0.20.0
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # current, then before vLLM 0.9.2
# signal -> histogram families, newest name first (vLLM 0.9.2-0.10 call inter-token "time per output token")
LATENCY = {
    "inter_token": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "ttft": ("vllm:time_to_first_token_seconds",),
}


def metrics_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base + "/metrics"


def targets(pool: PoolInfo, table: RoutingTable) -> tuple[list[str], set[str]]:
    """(metrics URLs to scrape, model names to select) for ``pool``."""
    models = [m for m in table.models.values() if m.pool is not None and m.pool.id == pool.id]
    names = {m.name for m in models}
    if pool.endpoints:
        return [metrics_url(e) for e in pool.endpoints], names
    if pool.metrics_url:
        return [pool.metrics_url], names
    return sorted({metrics_url(m.base_url) for m in models}), names


@dataclass(frozen=True)
class EndpointReading:
    gauges: Gauges
    latency: dict  # signal -> cumulative buckets (summed over the pool's models)


def parse_endpoint(text: str, models: set[str]) -> EndpointReading:
    """One endpoint's gauges and latency histograms for ``models`` (raises ValueError on garbage)."""
    running = waiting = 0.0
    capacity: float | None = None
    kv: float | None = None
    seen = False
    buckets: dict[str, dict[float, float]] = {}
    family_signal = {name: signal for signal, names in LATENCY.items() for name in names}
    for family in text_string_to_metric_families(text):
        signal = family_signal.get(family.name)
        for sample in family.samples:
            if sample.labels.get("model_name") not in models:
                continue
            if signal is not None:
                if sample.name == family.name + "_bucket":
                    le = float(sample.labels["le"])
                    into = buckets.setdefault(signal, {})
                    into[le] = into.get(le, 0.0) + sample.value
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
    gauges = Gauges(ok=True, running=running, waiting=waiting, waiting_capacity=capacity, kv_usage=kv)
    return EndpointReading(gauges, {signal: sorted(b.items()) for signal, b in buckets.items()})


def parse(text: str, models: set[str]) -> Gauges:
    return parse_endpoint(text, models).gauges


def fetch(url: str, models: set[str], client: httpx.Client, timeout: float) -> EndpointReading:
    response = client.get(url, timeout=timeout)
    response.raise_for_status()
    return parse_endpoint(response.text, models)


def combine(parts: dict[str, Gauges], failures: dict[str, str], held: float = 0.0,
            latency: dict | None = None, latency_window: float = 0.0) -> Gauges:
    """The pool's reading from its fresh endpoints (``parts``) and the failed ones."""
    total = len(parts) + len(failures)
    error = "; ".join(f"{url}: {why}" for url, why in sorted(failures.items())) or None
    if not parts:
        return Gauges(ok=False, error=error or "the pool has no backend to scrape", endpoints=total, fresh=0)
    values = list(parts.values())
    capacities = [p.waiting_capacity for p in values if p.waiting_capacity is not None]
    kvs = [p.kv_usage for p in values if p.kv_usage is not None]
    return Gauges(
        ok=True,
        running=sum(p.running for p in values),
        waiting=sum(p.waiting for p in values),
        waiting_capacity=sum(capacities) if len(capacities) == len(values) else None,
        kv_usage=sum(kvs) / len(kvs) if kvs else None,
        error=error,
        endpoints=total,
        fresh=len(parts),
        held=held,
        latency=latency or {},
        latency_window_seconds=latency_window,
    )


def scrape(urls: list[str], models: set[str], *, timeout: float, client: httpx.Client | None = None) -> Gauges:
    """One scrape of every URL, summed over those that answered."""
    if not urls or not models:
        return Gauges(ok=False, error="the pool has no backend to scrape", endpoints=len(urls), fresh=0)
    own = client is None
    client = client or httpx.Client(timeout=timeout)
    parts, failures = {}, {}
    try:
        for url in urls:
            try:
                parts[url] = fetch(url, models, client, timeout).gauges
            except (httpx.HTTPError, ValueError) as exc:
                failures[url] = str(exc) or type(exc).__name__
    finally:
        if own:
            client.close()
    return combine(parts, failures)


@dataclass
class _Endpoint:
    ok_at: float | None = None  # the last good scrape
    previous_ok_at: float | None = None
    latency: dict | None = None  # the last good cumulative histograms
    error: str | None = None
    failed_at: float | None = None
    reading: Gauges | None = None
    unreachable: bool = False  # the last scrape found no server there at all


class Scraper:
    """One pool's throttled scrapes: a fresh reading at most every ``scrape_seconds``."""

    def __init__(self, *, client: httpx.Client | None = None) -> None:
        self.client = client or httpx.Client()
        self.last_at: float | None = None
        self.last_good_at: float | None = None  # the last scrape any endpoint answered
        self.last: Gauges | None = None
        self.urls: list[str] = []
        self.endpoints: dict[str, _Endpoint] = {}

    def due(self, now: float, every: float) -> bool:
        return self.last_at is None or now - self.last_at >= every

    def outage(self, now: float) -> float | None:
        """Seconds since the last scrape any endpoint answered (None while the last one did)."""
        if self.last is not None and self.last.ok:
            return None
        return now - self.last_good_at if self.last_good_at is not None else None

    def read(self, pool: PoolInfo, table: RoutingTable, now: float, *, every: float, timeout: float,
             stale: float, held: Callable[[str], float] | None = None) -> Gauges | None:
        """A fresh reading when one is due, else None (a stale good reading counts as failed).

        ``held(url)`` is the width kept for an endpoint missing from this reading.
        """
        if not self.due(now, every):
            if self.last_good_at is not None and now - self.last_good_at > stale:
                return Gauges(ok=False, error=f"last good scrape {now - self.last_good_at:.0f}s old")
            return None
        self.urls, models = targets(pool, table)
        for gone in set(self.endpoints) - set(self.urls):
            del self.endpoints[gone]
        parts: dict[str, Gauges] = {}
        failures: dict[str, str] = {}
        latency: dict[str, list] = {}
        window = 0.0
        for url in self.urls:
            endpoint = self.endpoints.setdefault(url, _Endpoint())
            if not models:
                failures[url] = "the pool has no model"
                continue
            try:
                reading = fetch(url, models, self.client, timeout)
            except (httpx.HTTPError, ValueError) as exc:
                endpoint.error, endpoint.failed_at = str(exc) or type(exc).__name__, now
                endpoint.unreachable = isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
                failures[url] = endpoint.error
                continue
            endpoint.unreachable = False
            for signal, buckets in reading.latency.items():
                before = (endpoint.latency or {}).get(signal)
                if before is not None:
                    latency.setdefault(signal, []).append((url, histograms.delta(buckets, before)))
            if endpoint.latency is not None and endpoint.ok_at is not None:
                window = max(window, now - endpoint.ok_at)
            endpoint.previous_ok_at, endpoint.ok_at = endpoint.ok_at, now
            endpoint.latency, endpoint.error, endpoint.reading = reading.latency, None, reading.gauges
            parts[url] = reading.gauges
        kept = sum(held(url) for url in failures) if held is not None else 0.0
        gauges = combine(parts, failures, kept, latency, window)
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
            "fresh": g.fresh if g else None,
            "endpoints": {url: {"ok_at": e.ok_at, "error": e.error,
                                "running": e.reading.running if e.reading else None}
                          for url, e in self.endpoints.items()},
        }

    def close(self) -> None:
        self.client.close()

"""``/metrics`` in vLLM's Prometheus exposition format.

The families are built at scrape time from the engines' own counts (a custom
collector, no global registry), so a scrape is always exact and a reset or a
per-model scrape needs no bookkeeping of its own. Names and labels follow
``vllm/v1/metrics/loggers.py``: label ``model_name`` plus ``engine="0"``.
"""

from __future__ import annotations

from typing import Iterable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from lanes.sim.engine import ModelEngine

LABELS = ["model_name", "engine"]
CONTENT_TYPE = CONTENT_TYPE_LATEST


class VllmCollector:
    """Collects the given engines; anything with ``collect()`` can be exposed."""

    def __init__(self, engines: Iterable[ModelEngine]) -> None:
        self.engines = list(engines)

    def collect(self) -> Iterable[Metric]:
        running = GaugeMetricFamily("vllm:num_requests_running", "Number of requests in model execution batches.", labels=LABELS)
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels=LABELS)
        by_reason = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Number of requests waiting, by reason.",
            labels=[*LABELS, "reason"],
        )
        kv = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels=LABELS)
        gpu = GaugeMetricFamily("vllm:gpu_cache_usage_perc", "GPU KV-cache usage (vLLM < 0.9.2).", labels=LABELS)
        preempt = CounterMetricFamily("vllm:num_preemptions", "Cumulative number of preemptions.", labels=LABELS)
        ttft = HistogramMetricFamily("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels=LABELS)
        queue = HistogramMetricFamily("vllm:request_queue_time_seconds", "Histogram of time spent waiting in the queue.", labels=LABELS)

        for engine in self.engines:
            labels = [engine.model.name, "0"]
            running.add_metric(labels, engine.running)
            waiting.add_metric(labels, engine.waiting)
            if engine.model.metrics_flavor == "legacy":
                gpu.add_metric(labels, engine.kv_cache_usage)
            else:
                by_reason.add_metric([*labels, "capacity"], len(engine.queue))
                by_reason.add_metric([*labels, "deferred"], engine.deferred)
                kv.add_metric(labels, engine.kv_cache_usage)
            preempt.add_metric(labels, engine.preemptions)
            ttft.add_metric(labels, engine.ttft.cumulative(), engine.ttft.sum)
            queue.add_metric(labels, engine.queue_time.cumulative(), engine.queue_time.sum)

        for family in (running, waiting, by_reason, kv, gpu, preempt, ttft, queue):
            if family.samples:
                yield family


def exposition(engines: Iterable[ModelEngine]) -> bytes:
    return generate_latest(VllmCollector(engines))

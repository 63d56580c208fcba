"""``/metrics`` in vLLM's Prometheus exposition format, in the flavour of a vLLM release.

The families are built at scrape time (a custom collector, no global
registry). Gauges come from each engine's published step snapshot, so they lag
as vLLM's do (``stats.PublishedGauges``); counters and histograms are exact.
Names, labels and buckets follow ``vllm/v1/metrics/loggers.py``: label
``model_name`` plus ``engine``.

Flavours (``SimModel.metrics_flavor``), each what a vLLM release exports
(the dates are shared/REFERENCE.md's):

- ``current`` (0.32 and later): ``kv_cache_usage_perc``,
  ``num_requests_waiting_by_reason`` (first released in 0.20.0),
  ``inter_token_latency_seconds``, and the queue limits (0.29.0) with
  ``admission_rejections_total`` (in the 0.32 metrics docs);
- ``0.20-0.28``: waiting-by-reason, no queue limits, no rejections;
- ``0.12-0.19``: ``kv_cache_usage_perc``, no waiting-by-reason;
- ``0.9.2-0.11``: both ``kv_cache_usage_perc`` (since 0.9.2) and
  ``gpu_cache_usage_perc`` (removed in 0.12), ``time_per_output_token_seconds``
  instead of the inter-token histogram;
- ``legacy`` (before 0.9.2): ``gpu_cache_usage_perc`` only.
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

from lanes.sim.engine import EngineCore
from lanes.sim.stats import FINISH_REASONS

LABELS = ["model_name", "engine"]
CONTENT_TYPE = CONTENT_TYPE_LATEST
REJECTION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
NEW_KV = {"current", "0.20-0.28", "0.12-0.19", "0.9.2-0.11"}
OLD_KV = {"0.9.2-0.11", "legacy"}
INTER_TOKEN = {"current", "0.20-0.28", "0.12-0.19"}
BY_REASON = {"current", "0.20-0.28"}


class Scrape:
    """What one scrape exports: (model name, flavour, [(engine label, core)], rejections)."""

    def __init__(self) -> None:
        self.models: list[tuple[str, str, list[tuple[str, EngineCore]], dict[str, int]]] = []

    def add(self, name: str, flavor: str, engines: list[tuple[str, EngineCore]], rejections: dict[str, int]) -> None:
        self.models.append((name, flavor, engines, rejections))


class VllmCollector:
    def __init__(self, scrape: Scrape, now: float) -> None:
        self.scrape = scrape
        self.now = now

    def collect(self) -> Iterable[Metric]:
        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=[*LABELS, *extra])

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=[*LABELS, *extra])

        def histogram(name: str, doc: str) -> HistogramMetricFamily:
            return HistogramMetricFamily(name, doc, labels=LABELS)

        running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        by_reason = gauge("vllm:num_requests_waiting_by_reason", "Number of requests waiting, by reason.", ("reason",))
        kv = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        gpu = gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.")
        preempt = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        prompt = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        generation = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        success = counter("vllm:request_success", "Count of successfully processed requests.", ("finished_reason",))
        ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.")
        itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.")
        tpot = histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.")
        e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.")
        queue = histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.")
        rejected = CounterMetricFamily("vllm:admission_rejections", "Requests rejected at admission, by reason.",
                                       labels=["model_name", "reason"])

        for name, flavor, engines, rejections in self.scrape.models:
            for engine, core in engines:
                labels = [name, engine]
                seen = core.published.at(self.now, core.model.metrics_lag_s)
                running.add_metric(labels, seen.running)
                waiting.add_metric(labels, seen.waiting)
                if flavor in BY_REASON:
                    by_reason.add_metric([*labels, "capacity"], seen.waiting_capacity)
                    by_reason.add_metric([*labels, "deferred"], seen.waiting_deferred)
                if flavor in NEW_KV:
                    kv.add_metric(labels, seen.kv_usage)
                if flavor in OLD_KV:
                    gpu.add_metric(labels, seen.kv_usage)
                c = core.counters
                preempt.add_metric(labels, c.preemptions)
                prompt.add_metric(labels, c.prompt_tokens)
                generation.add_metric(labels, c.generation_tokens)
                for reason in FINISH_REASONS:
                    success.add_metric([*labels, reason], c.success[reason])
                ttft.add_metric(labels, c.ttft.cumulative(), c.ttft.sum)
                (itl if flavor in INTER_TOKEN else tpot).add_metric(labels, c.inter_token.cumulative(), c.inter_token.sum)
                e2e.add_metric(labels, c.e2e.cumulative(), c.e2e.sum)
                queue.add_metric(labels, c.queue_time.cumulative(), c.queue_time.sum)
            if flavor == "current":
                for reason in REJECTION_REASONS:
                    rejected.add_metric([name, reason], rejections.get(reason, 0))

        for family in (running, waiting, by_reason, kv, gpu, preempt, prompt, generation, success,
                       ttft, itl, tpot, e2e, queue, rejected):
            if family.samples:
                yield family


def exposition(scrape: Scrape, now: float) -> bytes:
    return generate_latest(VllmCollector(scrape, now))

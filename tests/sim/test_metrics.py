"""``/metrics`` parses as Prometheus text and says what the engine holds."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

from lanes.sim import SimModel

from .conftest import aeventually, async_client, chat_body


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample as (name, sorted labels) -> value."""
    text = httpx.get(url).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples, name: str, **labels) -> float:
    labels = {"engine": "0", **labels}
    return samples[(name, tuple(sorted(labels.items())))]


async def test_gauges_show_a_saturated_model(start_sim):
    sim = start_sim(SimModel(name="m", capacity=2, service_ms=300), SimModel(name="idle", capacity=8, service_ms=0))
    async with async_client(sim) as client:
        calls = [asyncio.create_task(client.post("/chat/completions", json=chat_body("m"))) for _ in range(5)]
        await aeventually(lambda: sim.stats()["m"]["in_flight"] == 5, what="5 in flight")
        samples = scrape(sim.url + "/metrics")
        await asyncio.gather(*calls)
    assert value(samples, "vllm:num_requests_running", model_name="m") == 2
    assert value(samples, "vllm:num_requests_waiting", model_name="m") == 3
    assert value(samples, "vllm:num_requests_waiting_by_reason", model_name="m", reason="capacity") == 3
    assert value(samples, "vllm:num_requests_waiting_by_reason", model_name="m", reason="deferred") == 0
    assert value(samples, "vllm:kv_cache_usage_perc", model_name="m") == 1.0
    assert value(samples, "vllm:num_requests_running", model_name="idle") == 0
    assert value(samples, "vllm:kv_cache_usage_perc", model_name="idle") == 0.0
    assert value(samples, "vllm:num_preemptions_total", model_name="m") == 0

    after = scrape(sim.url + "/metrics")
    assert value(after, "vllm:time_to_first_token_seconds_count", model_name="m") == 5
    assert value(after, "vllm:request_queue_time_seconds_count", model_name="m") == 5
    # two waited one 300 ms service in the queue, one waited two
    assert value(after, "vllm:request_queue_time_seconds_sum", model_name="m") > 1.0
    assert value(after, "vllm:request_queue_time_seconds_bucket", model_name="m", le="0.5") <= 4
    assert value(after, "vllm:time_to_first_token_seconds_sum", model_name="m") > 5 * 0.3


async def test_deferred_requests_wait_with_their_own_reason(start_sim):
    sim = start_sim(SimModel(name="m", capacity=4, defer_ms=400, service_ms=0))
    async with async_client(sim) as client:
        calls = [asyncio.create_task(client.post("/chat/completions", json=chat_body("m"))) for _ in range(2)]
        await aeventually(lambda: sim.stats()["m"]["waiting"] == 2, what="2 deferred")
        samples = scrape(sim.url + "/metrics")
        await asyncio.gather(*calls)
    assert value(samples, "vllm:num_requests_waiting_by_reason", model_name="m", reason="deferred") == 2
    assert value(samples, "vllm:num_requests_waiting_by_reason", model_name="m", reason="capacity") == 0
    assert value(samples, "vllm:num_requests_waiting", model_name="m") == 2


def test_one_model_can_be_scraped_alone(start_sim):
    sim = start_sim(SimModel(name="a", capacity=1), SimModel(name="b", capacity=1))
    names = {dict(labels)["model_name"] for _, labels in scrape(sim.url + "/metrics?model=b")}
    assert names == {"b"}
    assert httpx.get(sim.url + "/metrics?model=zz").status_code == 404


def test_a_legacy_model_exports_the_old_cache_gauge_and_no_reasons(start_sim):
    sim = start_sim(SimModel(name="old", capacity=1, metrics_flavor="legacy"))
    names = {name for name, _ in scrape(sim.url + "/metrics")}
    assert "vllm:gpu_cache_usage_perc" in names
    assert "vllm:kv_cache_usage_perc" not in names
    assert "vllm:num_requests_waiting_by_reason" not in names

"""``/metrics`` parses as Prometheus text, says what the engine holds, and lags as vLLM's does."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from lanes.errors import InvalidInput
from lanes.sim import SimModel

from .conftest import aeventually, async_client, chat_body, eventually, scrape, value


async def test_gauges_show_a_saturated_model(start_sim):
    sim = start_sim(SimModel(name="m", capacity=2, service_ms=1000, metrics_lag_s=0),
                    SimModel(name="idle", capacity=8, service_ms=0, metrics_lag_s=0))
    async with async_client(sim) as client:
        calls = [asyncio.create_task(client.post("/chat/completions", json=chat_body("m"))) for _ in range(5)]
        await aeventually(lambda: sim.stats()["m"]["in_flight"] == 5, what="5 in flight")
        # the gauges show the engine's last step, even without a lag: wait for the step
        samples = await aeventually(
            lambda: (s := scrape(sim.url + "/metrics")) and value(s, "vllm:num_requests_waiting", model_name="m") == 3 and s,
            what="a step that saw all 5")
        await asyncio.gather(*calls)
    assert value(samples, "vllm:num_requests_running", model_name="m") == 2
    assert value(samples, "vllm:num_requests_waiting", model_name="m") == 3
    assert value(samples, "vllm:num_requests_waiting_by_reason", model_name="m", reason="capacity") == 3
    assert value(samples, "vllm:num_requests_waiting_by_reason", model_name="m", reason="deferred") == 0
    # two short requests hold 2 x 2 blocks of 4096: KV usage is blocks, not running / capacity
    assert value(samples, "vllm:kv_cache_usage_perc", model_name="m") == 4 / 4096
    assert value(samples, "vllm:num_requests_running", model_name="idle") == 0
    assert value(samples, "vllm:num_preemptions_total", model_name="m") == 0

    after = scrape(sim.url + "/metrics")
    assert value(after, "vllm:time_to_first_token_seconds_count", model_name="m") == 5
    assert value(after, "vllm:request_queue_time_seconds_count", model_name="m") == 5
    assert value(after, "vllm:e2e_request_latency_seconds_count", model_name="m") == 5
    assert value(after, "vllm:request_success_total", model_name="m", finished_reason="stop") == 5
    assert value(after, "vllm:generation_tokens_total", model_name="m") == 5 * 16
    assert value(after, "vllm:prompt_tokens_total", model_name="m") == 5 * 2
    # two waited one 1 s service in the queue, one waited two
    assert value(after, "vllm:request_queue_time_seconds_sum", model_name="m") > 1.0
    assert value(after, "vllm:time_to_first_token_seconds_sum", model_name="m") > 5 * 0.3


async def test_deferred_requests_wait_with_their_own_reason(start_sim):
    sim = start_sim(SimModel(name="m", capacity=4, defer_ms=2000, service_ms=0, metrics_lag_s=0))
    async with async_client(sim) as client:
        calls = [asyncio.create_task(client.post("/chat/completions", json=chat_body("m"))) for _ in range(2)]
        await aeventually(lambda: sim.stats()["m"]["waiting_deferred"] == 2, what="2 deferred")
        samples = scrape(sim.url + "/metrics")
        await asyncio.gather(*calls)
    assert sim.stats()["m"]["served"] == 2
    assert value(samples, "vllm:num_requests_waiting_by_reason", model_name="m", reason="deferred") == 2
    assert value(samples, "vllm:num_requests_waiting_by_reason", model_name="m", reason="capacity") == 0
    assert value(samples, "vllm:num_requests_waiting", model_name="m") == 2


async def test_gauges_lag_by_the_configured_delay_and_the_admin_view_is_exact(start_sim):
    # a lag far longer than the test: the gauges cannot have caught up
    sim = start_sim(SimModel(name="m", capacity=4, ttft_ms=10, per_token_ms=20, tokens=10_000, metrics_lag_s=3600))
    async with async_client(sim) as client:
        calls = [asyncio.create_task(client.post("/chat/completions", json=chat_body("m"))) for _ in range(3)]
        await aeventually(lambda: sim.stats()["m"]["running"] == 3, what="3 running")
        # exact at once on the admin endpoint; the gauge still shows the engine as it was an hour ago
        assert value(scrape(sim.url + "/metrics"), "vllm:num_requests_running", model_name="m") == 0
        sim.configure("m", metrics_lag_s=0)  # the snapshots were kept: they show as soon as they are old enough
        await aeventually(lambda: value(scrape(sim.url + "/metrics"), "vllm:num_requests_running", model_name="m") == 3,
                          what="the gauge to show the step")
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
    await aeventually(lambda: sim.stats()["m"]["running"] == 0, what="the cancels to land")
    # Without a lag, any step since the cancels would show at once: none has
    # run (nothing is left to run), so the gauges keep their old values.
    stale = scrape(sim.url + "/metrics")
    assert value(stale, "vllm:num_requests_running", model_name="m") > 0
    assert value(stale, "vllm:kv_cache_usage_perc", model_name="m") > 0
    assert sim.stats()["m"]["kv_blocks_used"] == 0
    # aborted, not successes: vLLM counts only requests the engine finished
    assert value(stale, "vllm:request_success_total", model_name="m", finished_reason="abort") == 0
    assert sim.stats()["m"]["aborted"] == 3
    # the next request's step publishes the truth
    assert httpx.post(sim.base_url + "/chat/completions", json=chat_body("m", max_tokens=1)).status_code == 200
    fresh = scrape(sim.url + "/metrics")
    assert value(fresh, "vllm:num_requests_running", model_name="m") == 0


def test_the_metrics_endpoint_has_no_model_filter(start_sim):
    sim = start_sim(SimModel(name="a", capacity=1), SimModel(name="b", capacity=1))
    names = {dict(labels)["model_name"] for _, labels in scrape(sim.url + "/metrics?model=b")}
    assert names == {"a", "b"}  # vLLM serves one /metrics for everything behind it


FLAVORS = {
    "current": ({"vllm:kv_cache_usage_perc", "vllm:num_requests_waiting_by_reason",
                 "vllm:inter_token_latency_seconds_count", "vllm:admission_rejections_total"},
                {"vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds_count"}),
    # by-reason first released in 0.20.0; the queue limits and their counter only in current
    "0.20-0.28": ({"vllm:kv_cache_usage_perc", "vllm:num_requests_waiting_by_reason",
                   "vllm:inter_token_latency_seconds_count"},
                  {"vllm:gpu_cache_usage_perc", "vllm:admission_rejections_total"}),
    "0.12-0.19": ({"vllm:kv_cache_usage_perc", "vllm:inter_token_latency_seconds_count"},
                  {"vllm:gpu_cache_usage_perc", "vllm:num_requests_waiting_by_reason",
                   "vllm:admission_rejections_total"}),
    "0.9.2-0.11": ({"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                    "vllm:time_per_output_token_seconds_count"},
                   {"vllm:num_requests_waiting_by_reason", "vllm:inter_token_latency_seconds_count"}),
    "legacy": ({"vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds_count"},
               {"vllm:kv_cache_usage_perc", "vllm:num_requests_waiting_by_reason"}),
}


@pytest.mark.parametrize("flavor", FLAVORS)
def test_each_flavour_exports_what_its_vllm_releases_export(start_sim, flavor):
    sim = start_sim(SimModel(name="m", capacity=1, metrics_flavor=flavor))
    names = {name for name, _ in scrape(sim.url + "/metrics")}
    present, absent = FLAVORS[flavor]
    assert present <= names
    assert not (absent & names)
    assert {"vllm:num_requests_running", "vllm:num_preemptions_total", "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total", "vllm:e2e_request_latency_seconds_count"} <= names


@pytest.mark.parametrize("flavor", ["0.20-0.28", "0.12-0.19", "0.9.2-0.11", "legacy"])
def test_queue_limits_are_refused_on_a_flavour_whose_vllm_has_none(flavor):
    with pytest.raises(InvalidInput, match="max_num_queued_reqs/max_num_queued_tokens need metrics_flavor 'current'"):
        SimModel(name="m", metrics_flavor=flavor, max_num_queued_reqs=4)


def test_inter_token_latency_is_one_sample_per_token_after_the_first(start_sim):
    sim = start_sim(SimModel(name="m", capacity=1, ttft_ms=5, per_token_ms=5, tokens=6))
    assert httpx.post(sim.base_url + "/chat/completions", json=chat_body("m")).status_code == 200
    eventually(lambda: sim.stats()["m"]["served"] == 1, what="the answer counted")
    samples = scrape(sim.url + "/metrics")
    assert value(samples, "vllm:inter_token_latency_seconds_count", model_name="m") == 5
    assert value(samples, "vllm:time_to_first_token_seconds_count", model_name="m") == 1


async def test_a_request_being_tokenized_is_in_flight_but_in_no_gauge(start_sim):
    sim = start_sim(SimModel(name="m", capacity=4, tokenize_ms=3000, service_ms=0, metrics_lag_s=0))
    async with async_client(sim) as client:
        call = asyncio.create_task(client.post("/chat/completions", json=chat_body("m")))
        await aeventually(lambda: sim.stats()["m"]["in_flight"] == 1, what="the request to arrive")
        stats, samples = sim.stats()["m"], scrape(sim.url + "/metrics")
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
    assert (stats["running"], stats["waiting"]) == (0, 0)
    assert value(samples, "vllm:num_requests_running", model_name="m") == 0
    assert value(samples, "vllm:num_requests_waiting", model_name="m") == 0

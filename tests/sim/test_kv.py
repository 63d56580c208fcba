"""The KV cache over HTTP: long prompts wait below capacity, long outputs get preempted."""

from __future__ import annotations

import asyncio
import json

from lanes.sim import SimModel

from .conftest import aeventually, async_client, scrape, value


def words(n: int) -> list[dict]:
    return [{"role": "user", "content": "word " * n}]


async def test_long_prompts_wait_while_running_is_below_capacity(start_sim):
    # 100 blocks of 16 tokens: one 1000-token prompt takes 63 of them (its 500-token answer fits too)
    sim = start_sim(SimModel(name="m", capacity=8, kv_blocks=100, block_size=16, ttft_ms=10, per_token_ms=50,
                             tokens=500, metrics_lag_s=0))
    async with async_client(sim) as client:
        calls = [asyncio.create_task(client.post("/chat/completions", json={"model": "m", "messages": words(1000)}))
                 for _ in range(3)]
        await aeventually(lambda: sim.stats()["m"]["in_flight"] == 3 and sim.stats()["m"]["running"] == 1,
                          what="3 arrived, 1 running")
        stats = sim.stats()["m"]
        # the gauges follow at the engine's next step
        samples = await aeventually(
            lambda: (s := scrape(sim.url + "/metrics")) and value(s, "vllm:num_requests_waiting", model_name="m") == 2 and s,
            what="a step that saw all 3")
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
    assert (stats["running"], stats["waiting"], stats["capacity"]) == (1, 2, 8)
    assert stats["kv_blocks_used"] >= 63
    assert value(samples, "vllm:num_requests_running", model_name="m") == 1
    assert value(samples, "vllm:num_requests_waiting_by_reason", model_name="m", reason="capacity") == 2
    assert value(samples, "vllm:kv_cache_usage_perc", model_name="m") >= 0.63


async def test_long_outputs_preempt_the_newest_and_its_stream_stalls_then_finishes(start_sim):
    # two requests of 60 prompt tokens each grow towards 120 tokens (8 blocks): 10 blocks hold one
    # capacity 0 until both wait, so both are admitted in the same step
    sim = start_sim(SimModel(name="m", capacity=0, kv_blocks=10, block_size=16, ttft_ms=5, per_token_ms=5,
                             tokens=60, metrics_lag_s=0))
    request = {"model": "m", "messages": words(60), "stream": True}

    async def stream(client) -> tuple[int, int, bool]:
        async with client.stream("POST", "/chat/completions", json=request) as answer:
            lines = [line async for line in answer.aiter_lines() if line.startswith("data: {")]
        tokens = sum(1 for line in lines if json.loads(line[6:])["choices"][0]["delta"].get("content"))
        return answer.status_code, tokens, any('"error"' in line for line in lines)

    async with async_client(sim) as client:
        calls = asyncio.gather(stream(client), stream(client))
        await aeventually(lambda: sim.stats()["m"]["waiting"] == 2, what="both waiting")
        sim.configure("m", capacity=8)
        answers = await calls
    assert answers == [(200, 60, False), (200, 60, False)]
    stats = sim.stats()["m"]
    assert stats["preemptions"] >= 1 and stats["served"] == 2
    samples = scrape(sim.url + "/metrics")
    assert value(samples, "vllm:num_preemptions_total", model_name="m") == stats["preemptions"]
    assert value(samples, "vllm:generation_tokens_total", model_name="m") == 120

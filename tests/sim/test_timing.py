"""Service time: fixed, lognormal around its mean; the step law (a + b x batch +
c x context, plus prefill), whose per-token time is the same for the same batch
whatever max_num_seqs; TTFT over HTTP that grows with the prompt and the queue."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx

from lanes.sim import H100_LLAMA_8B, SimModel
from lanes.sim.model import new_rng, service_seconds, step_seconds

from .conftest import aeventually, async_client, chat_body, scrape, value  # noqa: F401


def test_a_fixed_service_time_is_exact():
    model = SimModel(name="m", capacity=4, service_ms=50)
    assert service_seconds(model, new_rng(model)) == 0.05


def test_lognormal_draws_keep_the_configured_mean_and_are_reproducible():
    model = SimModel(name="m", capacity=10, service_ms=200, distribution="lognormal", sigma=0.5)
    rng = new_rng(model)
    draws = [service_seconds(model, rng) for _ in range(20_000)]
    assert abs(statistics.fmean(draws) - 0.2) < 0.005
    assert statistics.pstdev(draws) > 0.05
    again = new_rng(model)
    assert [service_seconds(model, again) for _ in range(5)] == draws[:5]


def test_a_step_costs_a_plus_b_per_sequence_plus_c_per_context_token_plus_its_prefill():
    model = SimModel(name="m", per_token_ms=6.0, per_seq_ms=0.5, context_ms_per_1k=2.0, prefill_ms_per_token=0.01,
                     ttft_ms=3.0)
    rng = new_rng(model)
    assert step_seconds(model, rng, sequences=1, prefill_tokens=0, context_tokens=0) == 0.0065
    # 8 sequences attending 4,000 tokens: 6 + 8 x 0.5 + 4 x 2
    assert abs(step_seconds(model, rng, sequences=8, prefill_tokens=0, context_tokens=4000) - 0.018) < 1e-12
    # a prefill chunk of 1,000 tokens: its tokens, and the fixed extra of a prefill step
    assert abs(step_seconds(model, rng, sequences=1, prefill_tokens=1000, context_tokens=1000) - 0.0215) < 1e-12


def test_the_default_law_is_the_published_h100_llama_8b_fit():
    model = SimModel(name="m")
    assert (model.per_token_ms, model.per_seq_ms, model.context_ms_per_1k, model.prefill_ms_per_token) == (
        H100_LLAMA_8B.per_token_ms, H100_LLAMA_8B.per_seq_ms, H100_LLAMA_8B.context_ms_per_1k,
        H100_LLAMA_8B.prefill_ms_per_token)
    rng = new_rng(model)
    # the source's TPOT at 1 and 4 concurrent requests (6.48 and 6.59 ms), short contexts
    one = step_seconds(model, rng, sequences=1, prefill_tokens=0, context_tokens=300) * 1000
    four = step_seconds(model, rng, sequences=4, prefill_tokens=0, context_tokens=1200) * 1000
    assert abs(one - 6.48) < 0.05 and abs(four - 6.59) < 0.1


def itl_mean(sim, model: str) -> float:
    samples = scrape(sim.url + "/metrics")
    return value(samples, "vllm:inter_token_latency_seconds_sum", model_name=model) / value(
        samples, "vllm:inter_token_latency_seconds_count", model_name=model)


async def streams(sim, model: str, n: int, capacity: int, **extra) -> None:
    """``n`` streams held in the queue (capacity 0) until all arrived, then let in
    together at ``capacity``: the whole batch runs from its first step, however
    slowly the machine delivers the requests."""
    async with async_client(sim) as client:
        async def one():
            async with client.stream("POST", "/chat/completions", json=chat_body(model, stream=True, **extra)) as s:
                async for _ in s.aiter_bytes():
                    pass
        calls = [asyncio.create_task(one()) for _ in range(n)]
        await aeventually(lambda: sim.stats()[model]["waiting"] == n, what=f"{n} waiting")
        sim.configure(model, capacity=capacity)
        await asyncio.gather(*calls)


async def test_the_same_batch_costs_the_same_per_token_whatever_max_num_seqs(start_sim):
    law = dict(per_token_ms=10.0, per_seq_ms=1.0, context_ms_per_1k=0.0, prefill_ms_per_token=0.0, tokens=20)
    sim = start_sim(SimModel(name="narrow", capacity=0, **law), SimModel(name="wide", capacity=0, **law))
    await asyncio.gather(streams(sim, "narrow", 8, 8), streams(sim, "wide", 8, 64))
    narrow, wide = itl_mean(sim, "narrow"), itl_mean(sim, "wide")
    # 8 sequences decoding: 10 + 8 x 1 ms a step, in the engine's own time
    assert abs(narrow - 0.018) < 0.001 and abs(wide - 0.018) < 0.001, (narrow, wide)


async def test_time_per_token_grows_with_the_batch_from_the_first_request(start_sim):
    law = dict(capacity=0, per_token_ms=5.0, per_seq_ms=0.5, context_ms_per_1k=0.0, prefill_ms_per_token=0.0,
               tokens=20)
    sim = start_sim(SimModel(name="one", **law), SimModel(name="four", **law), SimModel(name="sixteen", **law))
    await asyncio.gather(streams(sim, "one", 1, 256), streams(sim, "four", 4, 256), streams(sim, "sixteen", 16, 256))
    one, four, sixteen = itl_mean(sim, "one"), itl_mean(sim, "four"), itl_mean(sim, "sixteen")
    assert abs(one - 0.0055) < 0.0005 and abs(four - 0.007) < 0.0005 and abs(sixteen - 0.013) < 0.0005
    assert one < four < sixteen


async def test_time_per_token_grows_with_the_context_the_batch_attends(start_sim):
    law = dict(capacity=0, per_token_ms=5.0, per_seq_ms=0.0, context_ms_per_1k=1.0, prefill_ms_per_token=0.0,
               tokens=10, kv_blocks=8192)
    sim = start_sim(SimModel(name="short", **law), SimModel(name="long", **law))
    long_prompt = [{"role": "user", "content": "w " * 2000}]
    await asyncio.gather(streams(sim, "short", 4, 64), streams(sim, "long", 4, 64, messages=long_prompt))
    # four sequences of ~2,000 tokens of context: 8 ms more per step than of ~2 tokens
    assert itl_mean(sim, "long") - itl_mean(sim, "short") > 0.0075


def test_a_request_takes_at_least_its_service_time(start_sim):
    sim = start_sim(SimModel(name="m", capacity=1, ttft_ms=60, per_token_ms=10, tokens=5))
    started = time.monotonic()
    assert httpx.post(sim.base_url + "/chat/completions", json=chat_body("m")).status_code == 200
    assert time.monotonic() - started >= 0.1


def ttft_mean(sim, model: str) -> float:
    samples = scrape(sim.url + "/metrics")
    return value(samples, "vllm:time_to_first_token_seconds_sum", model_name=model) / value(
        samples, "vllm:time_to_first_token_seconds_count", model_name=model)


async def test_ttft_over_http_grows_with_the_prompt_and_with_the_queue(start_sim):
    # 0.1 ms per prompt token: a 6000-word prompt costs 600 ms of prefill
    settings = dict(ttft_ms=15, per_token_ms=5, tokens=4, prefill_ms_per_token=0.1)
    sim = start_sim(SimModel(name="short", capacity=1, **settings), SimModel(name="long", capacity=1, **settings),
                    SimModel(name="queued", capacity=0, **settings))
    long_prompt = {"model": "long", "messages": [{"role": "user", "content": "word " * 6000}]}
    async with async_client(sim) as client:
        assert (await client.post("/chat/completions", json=chat_body("short"))).status_code == 200
        assert (await client.post("/chat/completions", json=long_prompt)).status_code == 200
        # five queued, then served one at a time: each waits for those before it
        calls = [asyncio.create_task(client.post("/chat/completions", json=chat_body("queued"))) for _ in range(5)]
        await aeventually(lambda: sim.stats()["queued"]["waiting"] == 5, what="5 queued")
        sim.configure("queued", capacity=1)
        answers = await asyncio.gather(*calls)
    assert [a.status_code for a in answers] == [200] * 5
    short, long, queued = ttft_mean(sim, "short"), ttft_mean(sim, "long"), ttft_mean(sim, "queued")
    assert long >= 0.6 > short
    # on average two whole services (35 ms each) before a queued request's own 15 ms: at least 85 ms. A busy
    # machine only adds to either figure, so the floor is the configured times, not the measured short one
    # (whose own delay would eat the margin); a queue that added nothing would read about 15 ms
    assert queued >= 0.015 + 0.07 - 0.002
    assert queued > short

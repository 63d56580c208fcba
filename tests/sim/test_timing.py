"""Service time: fixed, lognormal around its mean, slower past the knee, and
TTFT over HTTP that grows with the prompt and the queue."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx

from lanes.sim import SimModel, knee_factor
from lanes.sim.model import new_rng, service_seconds, step_seconds

from .conftest import aeventually, async_client, chat_body, scrape, value


def test_a_fixed_service_time_is_exact_and_ignores_the_knee():
    model = SimModel(name="m", capacity=4, service_ms=50)
    assert service_seconds(model, new_rng(model)) == 0.05
    assert knee_factor(model, 1.0) == 1.0


def test_lognormal_draws_keep_the_configured_mean_and_are_reproducible():
    model = SimModel(name="m", capacity=10, service_ms=200, distribution="lognormal", sigma=0.5)
    rng = new_rng(model)
    draws = [service_seconds(model, rng) for _ in range(20_000)]
    assert abs(statistics.fmean(draws) - 0.2) < 0.005
    assert statistics.pstdev(draws) > 0.05
    again = new_rng(model)
    assert [service_seconds(model, again) for _ in range(5)] == draws[:5]


def test_steps_slow_past_the_knee_like_a_real_engine():
    model = SimModel(name="m", capacity=10, knee=0.5, knee_slowdown=1.0)
    assert knee_factor(model, 0.5) == 1.0
    assert knee_factor(model, 1.0) == 2.0
    assert 1.0 < knee_factor(model, 0.8) < 2.0
    # token timing slows by default; a fixed service_ms does not
    assert knee_factor(SimModel(name="t", capacity=10), 1.0) == 1.5
    rng = new_rng(model)
    idle = step_seconds(model, rng, load=0.1, prefill_tokens=0, context_tokens=0)
    full = step_seconds(model, rng, load=1.0, prefill_tokens=0, context_tokens=0)
    assert (idle, full) == (0.01, 0.02)


def test_a_request_takes_at_least_its_service_time(start_sim):
    sim = start_sim(SimModel(name="m", capacity=1, ttft_ms=60, per_token_ms=10, tokens=5, knee_slowdown=0))
    started = time.monotonic()
    assert httpx.post(sim.base_url + "/chat/completions", json=chat_body("m")).status_code == 200
    assert time.monotonic() - started >= 0.1


def ttft_mean(sim, model: str) -> float:
    samples = scrape(sim.url + "/metrics")
    return value(samples, "vllm:time_to_first_token_seconds_sum", model_name=model) / value(
        samples, "vllm:time_to_first_token_seconds_count", model_name=model)


async def test_ttft_over_http_grows_with_the_prompt_and_with_the_queue(start_sim):
    # 0.1 ms per prompt token: a 6000-word prompt costs 600 ms of prefill
    settings = dict(ttft_ms=20, per_token_ms=5, tokens=4, prefill_ms_per_token=0.1, knee_slowdown=0)
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
    # on average two whole services (35 ms each) before a queued request's own prefill
    assert queued >= short + 0.07

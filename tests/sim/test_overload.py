"""Overload and death answered as vLLM answers them; 529 only from a named gateway mode."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from lanes.sim import SimModel

from .conftest import aeventually, async_client, chat_body, scrape


def rejections(sim, model: str) -> dict[str, float]:
    return {dict(labels)["reason"]: v for (name, labels), v in scrape(sim.url + "/metrics").items()
            if name == "vllm:admission_rejections_total" and dict(labels)["model_name"] == model}


async def test_by_default_the_queue_is_unbounded_and_every_request_is_answered_200(start_sim):
    sim = start_sim(SimModel(name="m", capacity=1, service_ms=20))
    async with async_client(sim) as client:
        answers = await asyncio.gather(*(client.post("/chat/completions", json=chat_body("m")) for _ in range(20)))
    assert [a.status_code for a in answers] == [200] * 20
    assert rejections(sim, "m") == {"max_num_queued_reqs": 0, "max_num_queued_tokens": 0}


async def test_past_max_num_queued_reqs_vllm_answers_503_busy_and_counts_it(start_sim):
    # running plus waiting is limited to 3
    sim = start_sim(SimModel(name="m", capacity=1, max_num_queued_reqs=3, service_ms=5000))
    async with async_client(sim) as client:
        held = [asyncio.create_task(client.post("/chat/completions", json=chat_body("m"))) for _ in range(3)]
        await aeventually(lambda: sim.stats()["m"]["in_flight"] == 3, what="3 held")
        refused = await client.post("/chat/completions", json=chat_body("m"))
        assert refused.status_code == 503
        error = refused.json()["error"]
        assert error["message"].startswith("The engine is currently busy")
        assert error["type"] == "Service Unavailable" and error["code"] == 503
        assert rejections(sim, "m") == {"max_num_queued_reqs": 1, "max_num_queued_tokens": 0}
        assert sim.stats()["m"]["admission_rejections"] == {"max_num_queued_reqs": 1}
        for call in held:
            call.cancel()
        await asyncio.gather(*held, return_exceptions=True)


async def test_past_max_num_queued_tokens_vllm_answers_503(start_sim):
    sim = start_sim(SimModel(name="m", capacity=4, max_num_queued_tokens=100, service_ms=5000))
    prompt = {"model": "m", "messages": [{"role": "user", "content": "word " * 60}]}
    async with async_client(sim) as client:
        first = asyncio.create_task(client.post("/chat/completions", json=prompt))
        await aeventually(lambda: sim.stats()["m"]["running"] == 1, what="60 prompt tokens held")
        refused = await client.post("/chat/completions", json=prompt)  # 120 > 100
        assert refused.status_code == 503
        assert "max_num_queued_tokens=100" in refused.json()["error"]["message"]
        assert rejections(sim, "m")["max_num_queued_tokens"] == 1
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)


@pytest.mark.parametrize("status", [529, 429])
async def test_only_the_named_gateway_mode_answers_its_status_past_capacity(start_sim, status):
    sim = start_sim(SimModel(name="m", capacity=2, overflow="gateway", reject_status=status, service_ms=200))
    async with async_client(sim) as client:
        answers = await asyncio.gather(*(client.post("/chat/completions", json=chat_body("m")) for _ in range(5)))
    rejected = [a for a in answers if a.status_code != 200]
    assert len(rejected) == 3 and {a.status_code for a in rejected} == {status}
    error = rejected[0].json()["error"]
    assert error["code"] == status and "capacity" in error["message"]
    stats = sim.stats()["m"]
    assert (stats["served"], stats["rejected"], stats["max_running"], stats["waiting"]) == (2, 3, 2, 0)


async def test_a_dead_engine_answers_500_per_request_and_503_on_health(start_sim):
    sim = start_sim(SimModel(name="m", capacity=2, ttft_ms=10, per_token_ms=50, tokens=1000))
    assert httpx.get(sim.url + "/health").status_code == 200
    async with async_client(sim) as client:
        # a stream already running when the engine dies ends with an error frame
        async with client.stream("POST", "/chat/completions", json=chat_body("m", stream=True)) as running:
            lines = running.aiter_lines()
            assert (await anext(lines)).startswith("data: {")
            httpx.post(sim.url + "/admin/models/m", json={"down": True})
            rest = [line async for line in lines if line]
        assert running.status_code == 200
        assert '"error"' in rest[-2] and rest[-1] == "data: [DONE]"
        answer = await client.post("/chat/completions", json=chat_body("m"))
    assert answer.status_code == 500
    assert "EngineCore encountered an issue" in answer.json()["error"]["message"]
    health = httpx.get(sim.url + "/health")
    assert health.status_code == 503
    httpx.post(sim.url + "/admin/models/m", json={"down": False})
    assert httpx.get(sim.url + "/health").status_code == 200
    assert httpx.post(sim.base_url + "/chat/completions", json=chat_body("m", max_tokens=2)).status_code == 200


def test_a_prompt_longer_than_the_kv_cache_is_a_bad_request(start_sim):
    sim = start_sim(SimModel(name="m", kv_blocks=4, block_size=16, tokens=4))
    answer = httpx.post(sim.base_url + "/chat/completions",
                        json={"model": "m", "messages": [{"role": "user", "content": "word " * 100}]})
    assert answer.status_code == 400
    assert "maximum context length is 64 tokens" in answer.json()["error"]["message"]

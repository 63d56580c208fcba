"""Overload and death answered as vLLM answers them; 529 only from a named gateway mode."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from lanes.sim import SimModel
from lanes.sim.served import QUEUE_OVERFLOW_MESSAGE, QUEUED_TOKENS_MESSAGE

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
        # vLLM's QueueOverflowError, word for word, in its error shape
        assert refused.json() == {"error": {"message": QUEUE_OVERFLOW_MESSAGE, "type": "Service Unavailable",
                                            "param": None, "code": 503}}
        assert rejections(sim, "m") == {"max_num_queued_reqs": 1, "max_num_queued_tokens": 0}
        assert sim.stats()["m"]["admission_rejections"] == {"max_num_queued_reqs": 1}
        for call in held:
            call.cancel()
        await asyncio.gather(*held, return_exceptions=True)


async def test_max_num_queued_reqs_counts_each_of_n_sequences_as_vllm_does(start_sim):
    # check_admission(n): unfinished + n > limit refuses; 2 held + n=2 = 4 passes 3
    sim = start_sim(SimModel(name="m", capacity=1, max_num_queued_reqs=4, service_ms=5000))
    async with async_client(sim) as client:
        held = [asyncio.create_task(client.post("/chat/completions", json=chat_body("m"))) for _ in range(2)]
        await aeventually(lambda: sim.stats()["m"]["in_flight"] == 2, what="2 held")
        assert (await client.post("/chat/completions", json=chat_body("m", n=3))).status_code == 503
        both = asyncio.create_task(client.post("/chat/completions", json=chat_body("m", n=2)))  # 2 + 2 = 4: in
        await aeventually(lambda: sim.stats()["m"]["waiting"] + sim.stats()["m"]["running"] == 4, what="4 queued")
        assert (await client.post("/chat/completions", json=chat_body("m"))).status_code == 503
        for call in (*held, both):
            call.cancel()
        await asyncio.gather(*held, both, return_exceptions=True)


def long_prompt(words: int, **extra) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "word " * words}], **extra}


async def test_an_idle_engine_admits_a_prompt_longer_than_max_num_queued_tokens(start_sim):
    # vLLM checks the backlog already there, not the new prompt: an idle engine admits any prompt
    sim = start_sim(SimModel(name="m", capacity=4, max_num_queued_tokens=500, tokens=4))
    answer = httpx.post(sim.base_url + "/chat/completions", json=long_prompt(600), timeout=30)
    assert answer.status_code == 200
    assert rejections(sim, "m")["max_num_queued_tokens"] == 0


async def test_requests_past_their_prefill_do_not_count_towards_max_num_queued_tokens(start_sim):
    # two 300-token prompts that are decoding hold no prefill backlog: a third is admitted
    sim = start_sim(SimModel(name="m", capacity=4, max_num_queued_tokens=500, tokens=10_000, per_token_ms=20))
    async with async_client(sim) as client:
        held = [asyncio.create_task(client.post("/chat/completions", json=long_prompt(300))) for _ in range(2)]
        await aeventually(lambda: sim.stats()["m"]["engines"][0]["running"] == 2
                          and sim.stats()["m"]["queued_prompt_tokens"] == 0, what="both decoding")
        third = await client.post("/chat/completions", json=long_prompt(300, max_tokens=1))
        assert third.status_code == 200
        for call in held:
            call.cancel()
        await asyncio.gather(*held, return_exceptions=True)


async def test_a_prefill_backlog_at_max_num_queued_tokens_answers_vllms_503(start_sim):
    # capacity 0: the prompts wait, still in prefill; 300 < 500 admits, 600 >= 500 refuses
    sim = start_sim(SimModel(name="m", capacity=0, max_num_queued_tokens=500))
    async with async_client(sim) as client:
        first = asyncio.create_task(client.post("/chat/completions", json=long_prompt(300)))
        await aeventually(lambda: sim.stats()["m"]["queued_prompt_tokens"] == 300, what="300 tokens waiting")
        second = asyncio.create_task(client.post("/chat/completions", json=long_prompt(300)))
        await aeventually(lambda: sim.stats()["m"]["queued_prompt_tokens"] == 600, what="600 tokens waiting")
        refused = await client.post("/chat/completions", json=long_prompt(1))
        assert refused.status_code == 503
        assert refused.json() == {"error": {"message": QUEUED_TOKENS_MESSAGE, "type": "Service Unavailable",
                                            "param": None, "code": 503}}
        assert rejections(sim, "m")["max_num_queued_tokens"] == 1
        for call in (first, second):
            call.cancel()
        await asyncio.gather(first, second, return_exceptions=True)


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


async def test_a_dead_engine_kept_alive_answers_500_per_request_and_503_on_health(start_sim):
    # VLLM_KEEP_ALIVE_ON_ENGINE_DEATH: the server stays, answering for its dead engine
    sim = start_sim(SimModel(name="m", capacity=2, per_token_ms=50, tokens=1000, keep_alive_on_engine_death=True,
                             exit_after_death_s=0.2))
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


async def test_a_dynamo_gateway_rejects_by_its_kv_block_threshold_not_by_request_count(start_sim):
    # 100 blocks of 16; a 600-word prompt holds 38 blocks: one engine is busy past 0.5 after two
    sim = start_sim(SimModel(name="m", capacity=64, overflow="gateway", kv_blocks=100, block_size=16,
                             gateway_kv_threshold=0.5, tokens=10_000 // 16, per_token_ms=50))
    async with async_client(sim) as client:
        held = [asyncio.create_task(client.post("/chat/completions", json=long_prompt(600))) for _ in range(2)]
        await aeventually(lambda: sim.stats()["m"]["running"] == 2, what="two running")
        refused = await client.post("/chat/completions", json=chat_body("m"))
        assert refused.status_code == 529  # far below capacity 64, but past the KV threshold
        for call in held:
            call.cancel()
        await asyncio.gather(*held, return_exceptions=True)


async def test_a_dynamo_gateway_rejects_past_its_prefill_token_threshold(start_sim):
    # capacity 0 keeps the prompts waiting, every token still to prefill
    sim = start_sim(SimModel(name="m", capacity=0, overflow="gateway", gateway_prefill_tokens_threshold=500))
    async with async_client(sim) as client:
        first = asyncio.create_task(client.post("/chat/completions", json=long_prompt(400)))
        await aeventually(lambda: sim.stats()["m"]["waiting"] == 1, what="400 tokens to prefill")
        second = asyncio.create_task(client.post("/chat/completions", json=long_prompt(400)))  # 400 <= 500: in
        await aeventually(lambda: sim.stats()["m"]["waiting"] == 2, what="800 tokens to prefill")
        assert (await client.post("/chat/completions", json=long_prompt(1))).status_code == 529
        for call in (first, second):
            call.cancel()
        await asyncio.gather(first, second, return_exceptions=True)

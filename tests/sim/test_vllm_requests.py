"""Requests as vLLM's OpenAI server takes them: ``n`` sequences, a 400 in vLLM's
error shape for what it would refuse, /v1/completions, and /v1/models with
each model's ``max_model_len``."""

from __future__ import annotations

import json

import httpx
import pytest

from lanes.sim import SimModel

from .conftest import chat_body


@pytest.fixture
def sim(start_sim):
    return start_sim(SimModel(name="m", capacity=8, per_token_ms=2, tokens=5, kv_blocks=64, block_size=16),
                     SimModel(name="short", capacity=8, per_token_ms=2, tokens=5, max_model_len=32))


def chat(sim, **body) -> httpx.Response:
    return httpx.post(sim.base_url + "/chat/completions", json={"model": "m", **body})


def test_n_gives_n_choices_from_n_sequences_in_the_engine(sim):
    answer = httpx.post(sim.base_url + "/chat/completions", json=chat_body("m", n=3))
    assert answer.status_code == 200
    body = answer.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["message"]["content"] and c["finish_reason"] == "stop" for c in body["choices"])
    assert body["usage"]["completion_tokens"] == 15  # three sequences of five tokens
    stats = sim.stats()["m"]
    assert stats["max_running"] == 3 and stats["served"] == 1


def test_a_stream_of_n_sequences_sends_each_choices_tokens_under_its_index(sim):
    with httpx.stream("POST", sim.base_url + "/chat/completions", json=chat_body("m", n=2, stream=True)) as answer:
        lines = [line for line in answer.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}  # a role chunk per choice
        assert len(mine) == 1 + 5 and mine[-1]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "body, message",
    [
        ({}, "messages: Field required"),
        ({"messages": "hello"}, "messages: Input should be a valid list"),
        ({"messages": ["hello"]}, "messages.0"),
        ({"messages": [], "max_tokens": 0}, "max_tokens must be at least 1, got 0."),
        ({"messages": [], "max_tokens": -3}, "max_tokens must be at least 1, got -3."),
        ({"messages": [], "max_tokens": "ten"}, "max_tokens: Input should be a valid integer"),
        ({"messages": [], "max_completion_tokens": 0}, "max_completion_tokens must be at least 1, got 0."),
        ({"messages": [], "n": 0}, "n must be at least 1, got 0."),
    ],
)
def test_what_vllm_refuses_is_a_400_in_its_error_shape(sim, body, message):
    answer = chat(sim, **body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "BadRequestError" and error["code"] == 400 and error["param"] is None
    assert message in error["message"]
    assert sim.stats()["m"]["in_flight"] == 0 and sim.stats()["m"]["served"] == 0  # nothing reached the engine


def test_prompt_and_answer_past_max_model_len_is_vllms_400(sim):
    answer = httpx.post(sim.base_url + "/chat/completions",
                        json={"model": "short", "messages": [{"role": "user", "content": "w " * 30}]})
    assert answer.status_code == 400
    assert "maximum context length is 32 tokens" in answer.json()["error"]["message"]


def test_models_report_their_max_model_len(sim):
    cards = {m["id"]: m for m in httpx.get(sim.base_url + "/models").json()["data"]}
    assert cards["m"]["max_model_len"] == 64 * 16  # the whole KV cache by default
    assert cards["short"]["max_model_len"] == 32
    assert cards["m"]["object"] == "model" and cards["m"]["owned_by"] == "vllm"


def test_completions_answer_text_choices(sim):
    answer = httpx.post(sim.base_url + "/completions", json={"model": "m", "prompt": "once upon a time", "n": 2,
                                                             "max_tokens": 3})
    assert answer.status_code == 200
    body = answer.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert all(c["text"] and c["finish_reason"] == "length" and c["logprobs"] is None for c in body["choices"])
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}


def test_completions_take_token_ids_and_stream_text_chunks(sim):
    with httpx.stream("POST", sim.base_url + "/completions",
                      json={"model": "m", "prompt": [1, 2, 3], "stream": True}) as answer:
        lines = [line for line in answer.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert len(chunks) == 5 and chunks[-1]["choices"][0]["finish_reason"] == "stop"  # no role chunk


@pytest.mark.parametrize("body, message", [({}, "prompt: Field required"), ({"prompt": 3}, "prompt: Input should be"),
                                           ({"prompt": "x", "max_tokens": 0}, "max_tokens must be at least 1")])
def test_a_bad_completions_request_is_a_400(sim, body, message):
    answer = httpx.post(sim.base_url + "/completions", json={"model": "m", **body})
    assert answer.status_code == 400 and message in answer.json()["error"]["message"]

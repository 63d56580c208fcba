"""The OpenAI-compatible surface: chat (streamed and not), embeddings, models."""

from __future__ import annotations

import json

import httpx
import pytest

from lanes.sim import SimModel

from .conftest import chat_body, free_port


@pytest.fixture
def sim(start_sim):
    return start_sim(
        SimModel(name="chat", capacity=4, ttft_ms=20, per_token_ms=5, tokens=6),
        SimModel(name="embed", kind="embedding", capacity=4, embedding_dim=12),
    )


def test_a_completion_has_the_openai_shape(sim):
    answer = httpx.post(sim.base_url + "/chat/completions", json=chat_body("chat"))
    assert answer.status_code == 200
    body = answer.json()
    assert body["object"] == "chat.completion" and body["model"] == "chat"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert body["usage"]["completion_tokens"] == 6
    assert sim.stats()["chat"]["served"] == 1


def test_a_stream_sends_one_chunk_per_token_then_done(sim):
    lines = []
    request = chat_body("chat", stream=True, stream_options={"include_usage": True})
    with httpx.stream("POST", sim.base_url + "/chat/completions", json=request) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in answer.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    role, *tokens = [c for c in chunks if c["choices"]]
    # vLLM's first chunk carries only the role
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(tokens) == 6 and all("role" not in c["choices"][0]["delta"] for c in tokens)
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 5 + ["stop"]
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    assert len({c["id"] for c in chunks}) == 1


def test_max_tokens_caps_the_answer(sim):
    request = chat_body("chat", stream=True, max_tokens=2)
    with httpx.stream("POST", sim.base_url + "/chat/completions", json=request) as answer:
        data = [json.loads(line.removeprefix("data: ")) for line in answer.iter_lines() if line.startswith("data: {")]
    assert len(data) == 1 + 2  # the role, then two tokens
    assert data[-1]["choices"][0]["finish_reason"] == "length"


def test_embeddings_give_one_unit_vector_per_input(sim):
    answer = httpx.post(sim.base_url + "/embeddings", json={"model": "embed", "input": ["a cat", "a dog", "a cat"]})
    assert answer.status_code == 200
    data = answer.json()["data"]
    assert [d["index"] for d in data] == [0, 1, 2]
    assert all(len(d["embedding"]) == 12 for d in data)
    assert data[0]["embedding"] == data[2]["embedding"] != data[1]["embedding"]
    assert abs(sum(x * x for x in data[0]["embedding"]) - 1) < 1e-3
    single = httpx.post(sim.base_url + "/embeddings", json={"model": "embed", "input": "a cat"}).json()
    assert single["data"][0]["embedding"] == data[0]["embedding"]


def test_models_lists_every_model_of_the_port(sim):
    names = [m["id"] for m in httpx.get(sim.base_url + "/models").json()["data"]]
    assert names == ["chat", "embed"]


def test_an_unknown_model_is_a_404_in_openai_form(sim):
    answer = httpx.post(sim.base_url + "/chat/completions", json=chat_body("nope"))
    assert answer.status_code == 404
    error = answer.json()["error"]
    assert error["type"] == "NotFoundError" and error["code"] == 404 and "nope" in error["message"]


@pytest.mark.parametrize(
    "path, body, status",
    [
        ("/chat/completions", {"model": "embed", "messages": []}, 400),  # wrong kind
        ("/embeddings", {"model": "chat", "input": "x"}, 400),
        ("/embeddings", {"model": "embed", "input": 3}, 400),
        ("/chat/completions", {"messages": []}, 400),  # no model
    ],
)
def test_malformed_requests_are_400s(sim, path, body, status):
    answer = httpx.post(sim.base_url + path, json=body)
    assert answer.status_code == status and "error" in answer.json()


def test_a_body_that_is_not_json_is_a_400(sim):
    answer = httpx.post(sim.base_url + "/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert answer.status_code == 400 and "not JSON" in answer.json()["error"]["message"]


def test_a_model_with_its_own_port_is_served_only_there(start_sim):
    port = free_port()
    sim = start_sim(SimModel(name="main", capacity=1, service_ms=0), SimModel(name="side", capacity=1, service_ms=0, port=port))
    assert sim.base_url_for("side") == f"http://127.0.0.1:{port}/v1"
    assert httpx.post(sim.base_url_for("side") + "/chat/completions", json=chat_body("side")).status_code == 200
    assert httpx.post(sim.base_url + "/chat/completions", json=chat_body("side")).status_code == 404
    # admin answers for every model on every port
    assert set(httpx.get(f"http://127.0.0.1:{port}/admin/stats").json()) == {"main", "side"}

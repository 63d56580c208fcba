"""A failure after the stream began: HTTP 200, an error frame, ``[DONE]``; and
the router's backend client takes it as the failure it is."""

from __future__ import annotations

import json

import httpx
import pytest

from lanes import BackendError
from lanes.catalog import ModelInfo
from lanes.routing.backend import BackendClient
from lanes.sim import SimModel

from .conftest import chat_body


@pytest.fixture
def sim(start_sim):
    return start_sim(SimModel(name="m", capacity=2, ttft_ms=5, per_token_ms=5, tokens=8),
                     SimModel(name="fixed", capacity=2, service_ms=5))


def test_error_next_sends_an_error_frame_then_done_in_a_200_stream(sim):
    sim.configure("m", error_next=1)
    with httpx.stream("POST", sim.base_url + "/chat/completions", json=chat_body("m", stream=True)) as answer:
        lines = [line for line in answer.iter_lines() if line]
    assert answer.status_code == 200
    frames = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert frames[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert frames[1]["choices"][0]["delta"] == {"content": "lorem"}
    assert frames[-1]["error"]["code"] == 500 and frames[-1]["error"]["message"]
    assert lines[-1] == "data: [DONE]"
    stats = sim.stats()["m"]
    assert (stats["failed"], stats["served"], stats["error_next"], stats["running"]) == (1, 0, 0, 0)
    # the next one is whole again
    with httpx.stream("POST", sim.base_url + "/chat/completions", json=chat_body("m", stream=True)) as answer:
        assert not any('"error"' in line for line in answer.iter_lines())


def test_error_next_without_streaming_is_a_500(sim):
    sim.configure("fixed", error_next=1)
    answer = httpx.post(sim.base_url + "/chat/completions", json=chat_body("fixed"))
    assert answer.status_code == 500 and "during generation" in answer.json()["error"]["message"]


def test_the_backend_client_treats_a_mid_stream_error_as_a_failure_not_an_empty_answer(sim):
    client = BackendClient()
    info = ModelInfo(name="m", base_url=sim.base_url, kind="chat", pool=None, service=None,
                     timeout_seconds=30.0, api_key_env=None)
    try:
        sim.configure("m", error_next=1)
        with pytest.raises(BackendError, match="failed mid-stream") as caught:
            client.call(info, {"messages": [{"role": "user", "content": "hi"}]}, timeout=10)
        assert caught.value.status == 500 and not caught.value.request_rejected
        answer = client.call(info, {"messages": [{"role": "user", "content": "hi"}]}, timeout=10)
        assert answer.body["choices"][0]["message"]["content"].startswith("lorem")
    finally:
        client.close()

"""A client that goes away frees what it held, wherever it was."""

from __future__ import annotations

import asyncio

import httpx

from lanes.sim import SimModel

from .conftest import aeventually, async_client, chat_body, eventually


def test_a_stream_closed_mid_way_frees_its_slot(start_sim):
    sim = start_sim(SimModel(name="m", capacity=1, ttft_ms=10, per_token_ms=200, tokens=50))
    with httpx.stream("POST", sim.base_url + "/chat/completions", json=chat_body("m", stream=True)) as answer:
        lines = answer.iter_lines()  # kept: dropping it would close the response
        assert next(lines).startswith("data: {")
        assert sim.stats()["m"]["running"] == 1
    # closing the response closes the connection: the 10 s answer stops now
    eventually(lambda: sim.stats()["m"]["running"] == 0, timeout=2, what="the slot to free")
    stats = sim.stats()["m"]
    assert (stats["cancelled"], stats["served"], stats["in_flight"]) == (1, 0, 0)
    # The call record says how each call ended (fault tests tell a cut call from a served one).
    httpx.post(sim.base_url + "/chat/completions", json=chat_body("m", max_tokens=1), timeout=30)
    assert [call["outcome"] for call in sim.calls()] == ["cancelled", "served"]


async def test_clients_giving_up_in_the_queue_or_in_service_leave_exact_counts(start_sim):
    sim = start_sim(SimModel(name="m", capacity=2, service_ms=5000))
    async with async_client(sim, timeout=0.5) as client:
        calls = [client.post("/chat/completions", json=chat_body("m")) for _ in range(6)]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(o, httpx.TimeoutException) for o in outcomes)
    await aeventually(lambda: sim.stats()["m"]["in_flight"] == 0, timeout=3, what="every request gone")
    stats = sim.stats()["m"]
    assert (stats["running"], stats["waiting"], stats["cancelled"], stats["max_running"]) == (0, 0, 6, 2)


async def test_a_waiter_that_leaves_does_not_hold_up_the_queue(start_sim):
    sim = start_sim(SimModel(name="m", capacity=1, service_ms=300))
    async with async_client(sim) as client, async_client(sim, timeout=0.1) as impatient:
        first = asyncio.create_task(client.post("/chat/completions", json=chat_body("m")))
        await aeventually(lambda: sim.stats()["m"]["running"] == 1, what="the first to run")
        gone = asyncio.create_task(impatient.post("/chat/completions", json=chat_body("m")))
        await aeventually(lambda: sim.stats()["m"]["waiting"] == 1, what="a waiter")
        third = asyncio.create_task(client.post("/chat/completions", json=chat_body("m")))
        assert isinstance((await asyncio.gather(gone, return_exceptions=True))[0], httpx.TimeoutException)
        answers = await asyncio.gather(first, third)
    assert [a.status_code for a in answers] == [200, 200]
    stats = sim.stats()["m"]
    assert (stats["served"], stats["cancelled"], stats["max_running"], stats["in_flight"]) == (2, 1, 1, 0)

"""Capacity and FIFO queueing, seen over HTTP (overload answers: test_overload)."""

from __future__ import annotations

import asyncio

from lanes.sim import SimModel

from .conftest import aeventually, async_client, chat_body, raw_post


async def test_requests_beyond_capacity_queue_and_all_complete(start_sim):
    # Given a model of capacity 3 in queue mode
    sim = start_sim(SimModel(name="m", capacity=3, service_ms=250))
    async with async_client(sim) as client:
        # When 3 + 4 requests arrive at once
        calls = [asyncio.create_task(client.post("/chat/completions", json=chat_body("m"))) for _ in range(7)]
        seen = await aeventually(lambda: (s := sim.stats()["m"])["in_flight"] == 7 and s, what="7 in flight")
        # Then 3 run and 4 wait
        assert (seen["running"], seen["waiting"]) == (3, 4)
        answers = await asyncio.gather(*calls)
    assert [a.status_code for a in answers] == [200] * 7
    final = sim.stats()["m"]
    assert final["max_running"] == 3
    assert final["max_in_flight"] == 7
    assert (final["served"], final["running"], final["waiting"], final["in_flight"]) == (7, 0, 0, 0)


async def test_the_queue_is_served_in_arrival_order(start_sim):
    # capacity 0 holds every arrival in the queue until it is raised
    sim = start_sim(SimModel(name="m", capacity=0, service_ms=20))
    finished: list[int] = []
    async with async_client(sim) as client:

        async def call(i: int) -> None:
            response = await client.post("/chat/completions", json=chat_body("m"))
            assert response.status_code == 200
            finished.append(i)

        calls = []
        for i in range(5):
            calls.append(asyncio.create_task(call(i)))
            # the next arrives only once this one is counted in
            await aeventually(lambda: sim.stats()["m"]["waiting"] == i + 1, what=f"arrival {i}")
        sim.configure("m", capacity=1)
        await asyncio.gather(*calls)
    assert finished == [0, 1, 2, 3, 4]


async def test_raising_capacity_at_runtime_admits_waiters_at_once(start_sim):
    # capacity 0 holds every request in the queue
    sim = start_sim(SimModel(name="m", capacity=0, service_ms=10))
    async with async_client(sim) as client:
        calls = [asyncio.create_task(client.post("/chat/completions", json=chat_body("m"))) for _ in range(4)]
        await aeventually(lambda: sim.stats()["m"]["waiting"] == 4, what="4 waiting")
        assert sim.stats()["m"]["running"] == 0
        sim.configure("m", capacity=2)
        answers = await asyncio.gather(*calls)
    assert all(a.status_code == 200 for a in answers)
    assert sim.stats()["m"]["max_running"] == 2


async def test_closed_loop_clients_never_look_over_their_own_limit(start_sim):
    """The simulator counts a request out before its last byte leaves, so a
    client that starts its next request after an answer is never over-counted:
    the peaks are a ground truth a router's width can be checked against."""
    sim = start_sim(SimModel(name="m", capacity=64, service_ms=0))
    limit = asyncio.Semaphore(4)
    async with async_client(sim) as client:

        async def worker(stream: bool) -> None:
            for _ in range(40):
                async with limit:
                    if stream:
                        async with client.stream("POST", "/chat/completions", json=chat_body("m", stream=True)) as r:
                            async for _ in r.aiter_bytes():
                                pass
                    else:
                        r = await client.post("/chat/completions", json=chat_body("m"))
                    assert r.status_code == 200

        await asyncio.gather(*(worker(i % 2 == 0) for i in range(12)))
    stats = sim.stats()["m"]
    assert stats["served"] == 480
    assert stats["max_in_flight"] <= 4
    assert stats["max_running"] <= 4


async def test_a_few_hundred_concurrent_connections_are_held(start_sim):
    sim = start_sim(SimModel(name="m", capacity=16, service_ms=20))
    answers = await asyncio.gather(*(raw_post(sim.port, "/v1/chat/completions", chat_body("m")) for _ in range(300)))
    assert [status for status, _ in answers] == [200] * 300
    stats = sim.stats()["m"]
    assert stats["max_running"] == 16 and stats["served"] == 300


def test_models_sharing_a_device_are_also_counted_together():
    import threading

    import httpx

    from lanes.sim import SimModel, Simulator

    # Calls long enough that the three overlap even on a loaded machine.
    models = [SimModel(name=n, capacity=2, service_ms=3_000.0, device="gpu1") for n in ("draw", "music")]
    with Simulator(models + [SimModel(name="solo", capacity=2, service_ms=10.0)], port=0) as sim:
        def call(name):
            httpx.post(sim.base_url + "/chat/completions", json={"model": name, "messages": []}, timeout=10)

        threads = [threading.Thread(target=call, args=(n,)) for n in ("draw", "draw", "music")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = sim.stats()
    assert stats["draw"]["max_in_flight"] == 2 and stats["music"]["max_in_flight"] == 1
    assert stats["draw"]["device_max_in_flight"] == stats["music"]["device_max_in_flight"] == 3
    assert stats["solo"]["device"] is None and stats["solo"]["device_max_in_flight"] == 0

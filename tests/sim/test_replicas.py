"""Several engines behind one address: replicas behind a load balancer, or data-parallel ranks."""

from __future__ import annotations

import asyncio

from lanes.sim import SimModel

from .conftest import aeventually, async_client, chat_body, scrape

LONG = dict(ttft_ms=10, per_token_ms=50, tokens=10_000, metrics_lag_s=0)


def running_series(sim) -> dict[str, float]:
    """engine label -> vllm:num_requests_running in one scrape."""
    return {dict(labels)["engine"]: v for (name, labels), v in scrape(sim.url + "/metrics").items()
            if name == "vllm:num_requests_running"}


async def test_each_scrape_reaches_one_replica_so_scrapes_differ(start_sim):
    sim = start_sim(SimModel(name="m", capacity=4, replicas=3, **LONG))
    async with async_client(sim) as client:
        call = asyncio.create_task(client.post("/chat/completions", json=chat_body("m")))
        await aeventually(lambda: sim.stats()["m"]["running"] == 1, what="one running")
        seen = [running_series(sim) for _ in range(30)]
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
    assert all(set(s) == {"0"} for s in seen)  # each replica is its own server: engine "0"
    assert {s["0"] for s in seen} == {0.0, 1.0}  # the one holding it, and the others
    engines = sim.stats()["m"]["engines"]
    assert len(engines) == 3 and sum(e["max_running"] for e in engines) == 1


async def test_data_parallel_ranks_export_one_series_each_and_share_the_queue_limit(start_sim):
    sim = start_sim(SimModel(name="m", capacity=4, replicas=2, data_parallel=True, max_num_queued_reqs=2, **LONG))
    async with async_client(sim) as client:
        calls = [asyncio.create_task(client.post("/chat/completions", json=chat_body("m"))) for _ in range(2)]
        await aeventually(lambda: sim.stats()["m"]["running"] == 2, what="two running")
        # the limit counts running plus waiting across ranks
        assert (await client.post("/chat/completions", json=chat_body("m"))).status_code == 503
        await aeventually(lambda: running_series(sim) == {"0": 1.0, "1": 1.0}, what="one per rank in /metrics")
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)


async def test_replicas_behind_a_balancer_each_keep_their_own_queue_limit(start_sim):
    sim = start_sim(SimModel(name="m", capacity=4, replicas=2, max_num_queued_reqs=1, **LONG))
    async with async_client(sim) as client:
        calls = [asyncio.create_task(client.post("/chat/completions", json=chat_body("m"))) for _ in range(2)]
        await aeventually(lambda: sim.stats()["m"]["running"] == 2, what="one on each replica")
        assert [e["running"] for e in sim.stats()["m"]["engines"]] == [1, 1]
        assert (await client.post("/chat/completions", json=chat_body("m"))).status_code == 503
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)

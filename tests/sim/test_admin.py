"""Runtime changes and failure injection, over HTTP and through the Python API."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
import inspect

import httpx
import pytest

from lanes.errors import InvalidInput
from lanes.sim import SimModel, Simulator
from lanes.sim.served import CONFIGURABLE

from .conftest import aeventually, async_client, chat_body, eventually


def post(sim, model: str = "m", **extra) -> httpx.Response:
    return httpx.post(sim.base_url + "/chat/completions", json=chat_body(model, **extra), timeout=10)


def test_admin_stats_report_every_model(start_sim):
    sim = start_sim(SimModel(name="m", capacity=3, service_ms=0), SimModel(name="e", kind="embedding"))
    post(sim)
    stats = httpx.get(sim.url + "/admin/stats").json()
    assert stats == sim.stats()
    assert set(stats["m"]) >= {"capacity", "running", "waiting", "in_flight", "max_running", "max_in_flight",
                               "served", "rejected", "failed"}
    assert (stats["m"]["capacity"], stats["m"]["served"], stats["m"]["max_in_flight"]) == (3, 1, 1)


def test_admin_changes_capacity_overflow_and_status_at_runtime(start_sim):
    sim = start_sim(SimModel(name="m", capacity=4, service_ms=0))
    answer = httpx.post(sim.url + "/admin/models/m", json={"capacity": 0, "overflow": "gateway", "reject_status": 429})
    assert answer.status_code == 200 and answer.json()["capacity"] == 0
    assert post(sim).status_code == 429
    httpx.post(sim.url + "/admin/models/m", json={"capacity": 1})
    assert post(sim).status_code == 200
    assert sim.stats()["m"]["rejected"] == 1


def test_admin_refuses_unknown_settings_and_bad_values_without_changing_anything(start_sim):
    sim = start_sim(SimModel(name="m", capacity=4))
    typo = httpx.post(sim.url + "/admin/models/m", json={"capacity": 2, "capacty": 3})
    assert typo.status_code == 400 and "capacty" in typo.json()["error"]["message"]
    bad = httpx.post(sim.url + "/admin/models/m", json={"capacity": 2, "reject_status": 200})
    assert bad.status_code == 400 and "reject_status 200" in bad.json()["error"]["message"]
    assert httpx.post(sim.url + "/admin/models/zz", json={}).status_code == 404
    assert httpx.post(sim.url + "/admin/models/m", content=b"[1]").status_code == 400
    assert sim.stats()["m"]["capacity"] == 4
    with pytest.raises(InvalidInput, match="overflow 'spill'"):
        sim.configure("m", overflow="spill")


def test_configure_names_every_runtime_setting():
    parameters = set(inspect.signature(Simulator.configure).parameters) - {"self", "name"}
    assert parameters == CONFIGURABLE


@pytest.mark.parametrize("status", [500, 503, 529])
def test_fail_next_fails_exactly_that_many_requests(start_sim, status):
    sim = start_sim(SimModel(name="m", capacity=2, service_ms=0))
    sim.configure("m", fail_next=3, fail_status=status)
    statuses = [post(sim).status_code for _ in range(5)]
    assert statuses == [status] * 3 + [200] * 2
    assert (sim.stats()["m"]["failed"], sim.stats()["m"]["served"]) == (3, 2)


def test_fail_rate_and_down(start_sim):
    sim = start_sim(SimModel(name="m", capacity=2, service_ms=0))
    sim.configure("m", fail_rate=1.0, fail_status=503)
    assert {post(sim).status_code for _ in range(3)} == {503}
    sim.configure("m", fail_rate=0.0)
    assert post(sim).status_code == 200


def test_a_hung_request_holds_its_slot_until_the_client_gives_up(start_sim):
    sim = start_sim(SimModel(name="m", capacity=1, service_ms=0))
    sim.configure("m", hang_next=1)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(sim.base_url + "/chat/completions", json=chat_body("m"), timeout=0.3)
    eventually(lambda: sim.stats()["m"]["running"] == 0, what="the hung slot to free")
    assert sim.stats()["m"]["cancelled"] == 1
    assert post(sim).status_code == 200


@pytest.mark.slow
async def test_reset_zeroes_counters_and_restarts_peaks_from_now(start_sim):
    # Slow enough that nothing ends before the reset, even on a loaded machine.
    sim = start_sim(SimModel(name="m", capacity=1, service_ms=4_000))
    async with async_client(sim) as client:
        calls = [asyncio.create_task(client.post("/chat/completions", json=chat_body("m"))) for _ in range(2)]
        await aeventually(lambda: sim.stats()["m"]["in_flight"] == 2, what="2 in flight")
        httpx.post(sim.url + "/admin/reset")
        stats = sim.stats()["m"]
        assert (stats["max_running"], stats["max_in_flight"], stats["served"]) == (1, 2, 0)
        await asyncio.gather(*calls)
    assert sim.stats()["m"]["served"] == 2


def test_reset_with_config_restores_the_start_settings(start_sim):
    sim = start_sim(SimModel(name="m", capacity=3, service_ms=0))
    sim.configure("m", capacity=1, fail_next=5)
    sim.reset(config=True)
    stats = sim.stats()["m"]
    assert (stats["capacity"], stats["fail_next"]) == (3, 0)
    assert post(sim).status_code == 200


def test_stopping_answers_a_hung_request_503_within_the_grace(start_sim):
    sim = start_sim(SimModel(name="m", capacity=1, service_ms=0), graceful_s=0.2)
    sim.configure("m", hang_next=1)
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(post, sim)
        eventually(lambda: sim.stats()["m"]["running"] == 1, what="the hung request to run")
        sim.stop()
        assert answer.result(timeout=5).status_code == 503

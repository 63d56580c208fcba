"""A dead engine goes away as vLLM's does: its API server exits (connection
refused) within a few seconds, at once after answering a request, unless kept
alive; a load balancer in front of replicas answers 502 or 503 for a gone one."""

from __future__ import annotations

import time

import httpx
import pytest

from lanes.sim import SimModel

from .conftest import chat_body, eventually, free_port


def refused(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=2)
    except httpx.ConnectError:
        return True
    except (httpx.RemoteProtocolError, httpx.ReadError):
        # Caught as the server exits: the kernel took the connection into the listening
        # socket's backlog, then the socket closed with it unanswered. Not refused yet.
        return False
    return False


def post(sim, **extra) -> httpx.Response:
    # a fresh connection each time: a pooled one would hide whether the port still accepts
    return httpx.post(sim.base_url + "/chat/completions", json=chat_body("m", max_tokens=2, **extra), timeout=10)


@pytest.mark.slow
def test_a_dead_engines_server_stops_accepting_connections_within_a_few_seconds(start_sim):
    sim = start_sim(SimModel(name="m", capacity=2, exit_after_death_s=5.0), port=free_port())
    assert post(sim).status_code == 200
    sim.configure("m", down=True)
    assert httpx.get(sim.url + "/health").status_code == 503  # dead, not yet gone
    eventually(lambda: refused(sim.url), timeout=20, interval=0.1, what="the port to close")
    assert sim.stats()["m"]["down"] is True  # the simulator itself still answers from Python
    # revived, it listens on the same port again (a restarted server)
    sim.configure("m", down=False)
    assert post(sim).status_code == 200
    assert httpx.get(sim.url + "/health").status_code == 200


def test_the_server_exits_as_soon_as_it_answered_a_request_for_its_dead_engine(start_sim):
    sim = start_sim(SimModel(name="m", capacity=2, exit_after_death_s=600), port=free_port())
    sim.configure("m", down=True)
    answer = post(sim)
    assert answer.status_code == 500
    assert "EngineCore encountered an issue" in answer.json()["error"]["message"]
    # vLLM's EngineDeadError handler sets should_exit: gone long before the 600 s watchdog
    eventually(lambda: refused(sim.url), timeout=10, interval=0.1, what="the port to close")


def test_kept_alive_a_dead_engine_answers_500_for_as_long_as_it_is_dead(start_sim):
    sim = start_sim(SimModel(name="m", capacity=2, exit_after_death_s=0.2, keep_alive_on_engine_death=True))
    sim.configure("m", down=True)
    statuses = [post(sim).status_code for _ in range(3)]
    eventually(lambda: sim.stats()["m"]["rejected"] + sim.stats()["m"]["failed"] >= 3, what="three answers")
    time.sleep(0.5)  # past exit_after_death_s: still there
    assert statuses == [500, 500, 500] and post(sim).status_code == 500
    assert httpx.get(sim.url + "/health").status_code == 503


@pytest.mark.parametrize("status, body", [(502, "502 Bad Gateway"), (503, "upstream connect error")])
def test_a_balancer_answers_its_status_for_a_replica_whose_server_is_gone(start_sim, status, body):
    sim = start_sim(SimModel(name="m", capacity=2, replicas=2, balancer_status=status, exit_after_death_s=600))
    sim.configure("m", down_replicas=[1])
    # round robin: replica 0 serves; replica 1's first request gets its server's 500, and that server exits
    first = [post(sim) for _ in range(2)]
    assert [a.status_code for a in first] == [200, 500]
    eventually(lambda: sim.stats()["m"]["exited_replicas"] == [1], what="replica 1's server gone")
    later = [post(sim) for _ in range(4)]
    assert [a.status_code for a in later] == [200, status, 200, status]
    assert body in later[1].text
    assert not refused(sim.url)  # the balancer itself still accepts connections
    sim.configure("m", down_replicas=[])
    assert [post(sim).status_code for _ in range(2)] == [200, 200]


def test_a_balancer_in_front_of_a_wholly_dead_model_answers_502_on_every_request(start_sim):
    sim = start_sim(SimModel(name="m", capacity=2, replicas=3, exit_after_death_s=0.3))
    sim.configure("m", down=True)
    eventually(lambda: sim.stats()["m"]["exited_replicas"] == [0, 1, 2], what="every replica's server gone")
    assert {post(sim).status_code for _ in range(3)} == {502}


def test_down_replicas_are_checked_against_the_replicas(start_sim):
    sim = start_sim(SimModel(name="m", replicas=2))
    answer = httpx.post(sim.url + "/admin/models/m", json={"down_replicas": [2]})
    assert answer.status_code == 400
    assert "down_replicas [2]" in answer.json()["error"]["message"] or "(2,)" in answer.json()["error"]["message"]

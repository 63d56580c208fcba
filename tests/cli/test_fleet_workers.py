"""Issue 10 point 6: whether a fleet has a worker is visible, and work sent
to a fleet without one says so; a --wait that gives up exits 1 with the id."""

from __future__ import annotations

import json

import pytest

from lanes.sim import SimModel
from tests.cli.conftest import CHAT, DOC, clean_db, lanes
from tests.e2e.harness import deploy
from tests.polling import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def dep(tmp_path_factory, embedded_redis):
    # One deployment for the module: starting a fleet's worker is the slow part.
    deployment = deploy(tmp_path_factory.mktemp("dep"), clean_db(embedded_redis), json.loads(json.dumps(DOC)),
                        [SimModel(name="m", capacity=8, service_ms=20.0), SimModel(name="n", capacity=8)], ["gpu"])
    yield deployment
    deployment.close()


def listed(dep) -> dict[str, list[str]]:
    done = lanes("worker", "--list", "--json", env=dep.env)
    assert done.returncode == 0, done.stderr
    return {row["fleet"]: row["workers"] for row in json.loads(done.stdout)}


def test_submit_warns_when_the_fleet_has_no_live_worker(dep):
    parked = lanes("submit", "parked", "--payload", json.dumps(CHAT), env=dep.env)
    assert parked.returncode == 0, parked.stderr
    assert parked.stdout.strip()  # the task id: the work is queued all the same
    assert "warning: fleet 'idle' has no live worker" in parked.stderr
    assert "lanes worker --fleet idle" in parked.stderr

    served = lanes("submit", "chat", "--payload", json.dumps(CHAT), env=dep.env)
    assert served.returncode == 0 and "warning" not in served.stderr


def test_a_wait_that_gives_up_exits_1_and_names_the_queued_task(dep):
    done = lanes("submit", "parked", "--payload", json.dumps(CHAT), "--wait", "--timeout", "1", env=dep.env)

    assert done.returncode == 1, done.stdout + done.stderr
    task_id = done.stdout.strip()
    assert task_id and f"task {task_id} did not finish within 1s" in done.stderr
    assert "Traceback" not in done.stderr
    shown = lanes("result", task_id, env=dep.env)
    assert shown.returncode == 0 and json.loads(shown.stdout)["state"] == "PENDING"


# Last in the module: it stops the module's worker.
def test_worker_list_and_pools_show_each_fleets_live_workers(dep):
    # The fleet's foreground and background processes, each with its heartbeat.
    fleets = eventually(lambda: (f := listed(dep)) and len(f.get("gpu", [])) == 2 and f, timeout=30, interval=0.5,
                        what="both worker processes listed")
    assert set(fleets) == {"gpu", "idle"}
    assert all(name.startswith("gpu@") for name in fleets["gpu"])
    assert fleets["idle"] == []
    pools = lanes("pools", "--json", env=dep.env)
    assert {row["pool"]: row["live_workers"] for row in json.loads(pools.stdout)} == fleets
    table = lanes("pools", env=dep.env)
    assert table.returncode == 0 and "workers" in table.stdout

    dep.stop_worker("gpu")  # a graceful stop takes the worker off the list (a killed one: its entry lapses)

    eventually(lambda: listed(dep) == {"gpu": [], "idle": []}, timeout=90, interval=1.0, what="the worker gone")

"""What an operator does: watch lanes, resize a pool, run the demo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import redis

from lanes import Priority
from lanes.sim import SimModel
from tests.e2e.harness import deploy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

DOC = {
    "pools": [{"name": "gpu", "width": 2, "ceiling": 8}],
    "models": [{"name": "m", "base_url": "{sim}", "pool": "gpu"}],
    "workflows": [{"name": "chat", "candidates": ["m"]}],
}


@pytest.fixture
def dep(tmp_path, embedded_redis):
    url = embedded_redis.url.rsplit("/", 1)[0] + "/4"
    redis.Redis.from_url(url).flushdb()
    deployment = deploy(tmp_path, url, json.loads(json.dumps(DOC)), [SimModel(name="m", capacity=8, service_ms=20.0)],
                        ["gpu"])
    yield deployment
    deployment.close()


def lanes_cli(dep, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "lanes.cli", *args], env=dep.env, capture_output=True,
                          text=True, timeout=timeout)


def worker_concurrency(dep) -> int | None:
    stats = dep.client.celery.control.inspect(timeout=1.0).stats() or {}
    for name, info in stats.items():
        if name.startswith("gpu@"):
            return info["pool"]["max-concurrency"]
    return None


def test_pools_shows_the_live_lane_of_every_pool(dep):
    lane = dep.lane("gpu")
    with lane.acquire(Priority.INTERACTIVE, timeout=5):
        shown = lanes_cli(dep, "pools", "--json")
    assert shown.returncode == 0, shown.stderr
    (row,) = json.loads(shown.stdout)
    assert row["pool"] == "gpu" and row["width"] == 2 and row["in_flight"] == 1
    assert row["queued"] == {"interactive": 0, "user_tool": 0, "background": 0}
    table = lanes_cli(dep, "pools")
    assert table.returncode == 0 and "gpu" in table.stdout


def test_set_width_resizes_the_lane_and_the_fleet_follows(dep):
    # Pool threads: 2 x width for the foreground queue, as many for background.
    assert worker_concurrency(dep) == 8
    done = lanes_cli(dep, "pools", "set-width", "gpu", "3")
    assert done.returncode == 0, done.stderr
    assert dep.lane("gpu").stats().width == 3
    assert dep.table().pools["gpu"].width == 3
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and worker_concurrency(dep) != 12:
        time.sleep(0.5)
    assert worker_concurrency(dep) == 12
    result = dep.client.submit("chat", {"messages": [{"role": "user", "content": "x"}]}, deadline=30)
    assert result.get(timeout=30)["model"] == "m"


@pytest.mark.parametrize(("args", "message"), [
    (["pools", "set-width", "gpu", "0"], "width 0 is not a width >= 1"),
    (["pools", "set-width", "gpu", "9"], "outside pool 'gpu'"),
    (["pools", "set-width", "nope", "2"], "unknown pool 'nope' (known: gpu)"),
    (["worker", "--fleet", "nope"], "unknown fleet 'nope' (known: gpu)"),
])
def test_operator_mistakes_get_one_clear_line_and_change_nothing(dep, args, message):
    before = dep.lane("gpu").stats().width
    done = lanes_cli(dep, *args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and message in done.stderr and "Traceback" not in done.stderr
    assert dep.lane("gpu").stats().width == before == dep.table().pools["gpu"].width


def test_worker_lists_the_fleets(dep):
    done = lanes_cli(dep, "worker", "--list", "--json")
    assert done.returncode == 0
    (listed,) = json.loads(done.stdout)
    assert listed["fleet"] == "gpu" and [w.split("@")[0] for w in listed["workers"]] == ["gpu"]


def test_the_demo_runs_the_product_on_embedded_defaults(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANES_")}
    env["LANES_STATE_DIR"] = str(tmp_path / "state")
    done = subprocess.run([sys.executable, "-m", "lanes.cli", "demo", "--requests", "40"], env=env,
                          capture_output=True, text=True, timeout=200, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 failed" in done.stdout and "no backend ever saw more than its width" in done.stdout
    for pool in ("aifarm-gpu0-dialog", "aifarm-gpu2-utility", "aifarm-gpu1-media", "aifarm-embedder"):
        assert pool in done.stdout
    # The demo stops the embedded Redis it started.
    from lanes.embedded import EmbeddedRedis

    assert not EmbeddedRedis(tmp_path / "state" / "redis").is_running()


def test_an_unreachable_redis_is_one_clear_line_and_exit_3(dep):
    env = {**dep.env, "LANES_REDIS_URL": "redis://127.0.0.1:1/0", "LANES_REDIS_TIMEOUT_SECONDS": "1"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "lanes.cli", "submit", "chat", "--payload",
                           json.dumps({"messages": [{"role": "user", "content": "x"}]})],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr
    assert time.monotonic() - started < 30


def test_sigterm_to_lanes_worker_stops_the_whole_fleet_worker(dep):
    dep.stop_worker("gpu")  # this test runs the fleet's worker the way an operator does
    proc = subprocess.Popen([sys.executable, "-m", "lanes.cli", "worker", "--fleet", "gpu"], env=dep.env)
    dep.workers["gpu"] = proc  # whatever happens below, the fixture stops it
    dep.wait_for_workers(["gpu"])
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert children, "the supervisor runs its worker as a child"
    proc.terminate()
    assert proc.wait(40) == 0
    # The supervisor took the signal itself and stopped its worker: nothing is left running.
    assert not any(_running(int(pid)) for pid in children)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False

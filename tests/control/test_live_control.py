"""The controllers live: real workers, ``lanes sim`` in its own process with its capacity
(``max_num_seqs``) changed at runtime through its admin endpoint, the lane's width
following it. The simulator runs its physical step law (about 1 s an answer: 25 tokens
at 40 ms a step, a little more per sequence in the batch), never a fixed service time.

One deployment, two workers of the fleet, a closed loop of clients keeping
work waiting. The ``vllm`` controller ticks every second and scrapes every
second.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest
import redis
from celery.exceptions import TimeoutError as ResultTimeout

from lanes.control.store import ControlStore
from lanes.namespace import Namespace
from tests.e2e.harness import RemoteSim, deploy
from tests.polling import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CHAT = {"messages": [{"role": "user", "content": "x"}]}


def document(controller) -> dict:
    return {
        "pools": [{"name": "gpu", "width": 4, "floor": 1, "ceiling": 16, "controller": controller}],
        "models": [{"name": "m", "base_url": "{sim}", "pool": "gpu"}],
        "workflows": [{"name": "chat", "candidates": ["m"]}],
    }


# A measured running cap is probed above again after ``cap_backoff`` readings (24 by default):
# how soon a grown backend is found. Here 8 readings of 1 s, so the growth 6 -> 12 below is
# found well inside its 40 s on a loaded machine (at 24, the probe came 25-31 s after the growth
# on two busy cores, and CI's slower decisions ran past 40 s).
VLLM = {"kind": "vllm", "interval_seconds": 1.0, "scrape_seconds": 1.0, "timeout_seconds": 1.0, "cap_backoff": 8}


class Load:
    """Clients that each submit, wait for the answer, and submit again, until stopped."""

    def __init__(self, dep, clients: int) -> None:
        self.dep = dep
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.timeouts = 0
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]
        for thread in self.threads:
            thread.start()

    def _client(self) -> None:
        while not self.stop.is_set():
            try:
                self.dep.client.submit("chat", CHAT, deadline=60).get(timeout=20)
            except ResultTimeout:
                # A task the killed worker held comes back only after Celery's
                # visibility timeout; the client moves on as a caller would.
                self.timeouts += 1
            except BaseException as exc:  # reported by close()
                self.errors.append(exc)
                return

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)


@pytest.fixture
def dep(tmp_path, embedded_redis):
    url = embedded_redis.url.rsplit("/", 1)[0] + "/7"
    redis.Redis.from_url(url).flushdb()
    sim = RemoteSim(["m:6"], extra_args=("--tokens", "25", "--per-token-ms", "40"))
    deployment = deploy(tmp_path, url, document(VLLM), sim, ["gpu"], extra_env={"LANES_MEMORY_GATE_HIGH": "0.9"})
    yield deployment
    deployment.close()
    sim.stop()


def store(dep) -> ControlStore:
    return ControlStore(redis.Redis.from_url(dep.redis_url), Namespace(dep.settings.key_prefix))


def width(dep) -> int:
    return dep.lane("gpu").stats().width


def test_the_width_follows_the_backends_capacity_and_a_second_worker_takes_over(dep, tmp_path):
    pool_id = dep.table().pools["gpu"].id
    control = store(dep)
    # A second worker of the same fleet, started directly, competing for the lease.
    second = subprocess.Popen(
        [sys.executable, "-m", "workers.main", "--fleet", "gpu", "--foreground", "16",
         "--background", "16", "--hostname", "gpu-second@test"], env=dep.env)
    load = Load(dep, 40)
    try:
        # Capacity 6, untold: the width finds it.
        eventually(lambda: 5 <= width(dep) <= 7 and control.read(pool_id).decision == "hold",
                   timeout=40, interval=0.2, what="width near capacity 6")
        # The backend grows to 12 at runtime: the width follows.
        dep.sim.configure("m", capacity=12)
        eventually(lambda: 11 <= width(dep) <= 13, timeout=40, interval=0.2, what="width near capacity 12")

        # The leader dies without a word: another worker takes the lease over.
        leader = control.leader(pool_id)
        pid = int(leader.split("-", 1)[0])
        os.kill(pid, signal.SIGKILL)
        new_leader = eventually(lambda: (l := control.leader(pool_id)) and l != leader and l, timeout=20,
                                interval=0.1, what="a new leader")
        assert int(new_leader.rsplit("|", 1)[1]) > int(leader.rsplit("|", 1)[1])  # a higher fence
        # A lease lapses within two intervals (1 s each here) of its last renewal.
        lease_ms = redis.Redis.from_url(dep.redis_url).pttl(Namespace(dep.settings.key_prefix).control_leader(pool_id))
        assert 0 < lease_ms <= 2000

        # It keeps deciding: the backend shrinks to 3 and the width follows.
        dep.sim.configure("m", capacity=3)
        eventually(lambda: width(dep) <= 4, timeout=40, interval=0.2, what="width near capacity 3")
        eventually(lambda: control.read(pool_id).decision == "hold", timeout=20, interval=0.2, what="settled")
        settled_width = width(dep)
        # A shrink revokes no one: let the requests admitted under the wider lane drain first.
        eventually(lambda: (s := dep.lane("gpu").stats()).in_flight <= s.width, timeout=20, what="drained")
        dep.sim.reset()
        eventually(lambda: dep.sim.stats()["m"]["served"] >= 20, timeout=40, what="work served at capacity 3")
        # Running never exceeds capacity in vLLM; what the lane sends stays within one step above it.
        assert dep.sim.stats()["m"]["max_in_flight"] <= max(settled_width, 3) + 2
    finally:
        load.close()
        second.send_signal(signal.SIGTERM)
        second.wait(60)
    assert not load.errors, load.errors[:3]
    changes = sorted(dep.client_events(kind="width_change"), key=lambda e: e.time)
    assert changes and all(e.pool == "gpu" for e in changes)
    assert all(1 <= e.detail["new"] <= 16 for e in changes)  # within [floor, ceiling]
    assert any(e.detail["new"] > e.detail["old"] for e in changes)
    assert any(e.detail["new"] < e.detail["old"] for e in changes)
    # No two leaders acted in one interval: in time order, the fences of the leases that made
    # the changes never go back (once a newer leader acted, no older one did again).
    fences = [int(e.detail["leader"].rsplit("|", 1)[1]) for e in changes]
    assert fences == sorted(fences) and len(set(fences)) >= 2, fences


def test_turning_the_controller_off_restores_the_configured_width_at_once(dep, tmp_path):
    load = Load(dep, 40)
    try:
        eventually(lambda: width(dep) >= 6, timeout=40, interval=0.2, what="the controller grew the width")
        doc = document({"kind": "off"})
        doc["models"][0]["base_url"] = dep.sim.base_url
        path = tmp_path / "off.yaml"
        path.write_text(json.dumps(doc))
        done = subprocess.run([sys.executable, "-m", "lanes.cli", "catalog", "apply", str(path)], env=dep.env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        eventually(lambda: width(dep) == 4, timeout=30, interval=0.2, what="the configured width 4")
    finally:
        load.close()
    assert not load.errors, load.errors[:3]

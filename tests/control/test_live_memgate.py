"""The worker memory gate live: a real fleet worker reading a cgroup the test writes.

The worker's gate reads ``LANES_MEMORY_GATE_CGROUP`` (a folder with
``memory.current`` and ``memory.max``, as cgroup v2 has them); the test moves
the numbers in those files, and the worker must stop taking tasks above the
high mark, take them again below the low one, and say so in ``celery inspect
stats`` (the ``memory_gate`` entry Flower shows too).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from lanes.sim import SimModel
from tests.e2e.harness import deploy
from tests.polling import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CHAT = {"messages": [{"role": "user", "content": "x"}]}
DOC = {
    "pools": [{"name": "gpu", "width": 2, "ceiling": 2}],
    "models": [{"name": "m", "base_url": "{sim}", "pool": "gpu"}],
    "workflows": [{"name": "chat", "candidates": ["m"]}],
}


def set_memory(cgroup: Path, used: int, limit: int = 1000) -> None:
    # Written whole, then renamed: the worker never reads half a number.
    for name, value in (("memory.max", limit), ("memory.current", used)):
        staging = cgroup / f".{name}"
        staging.write_text(f"{value}\n")
        staging.replace(cgroup / name)


@pytest.fixture
def gated(tmp_path, embedded_redis):
    url = embedded_redis.url.rsplit("/", 1)[0] + "/5"
    redis.Redis.from_url(url).flushdb()
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    set_memory(cgroup, 500)
    env = {"LANES_MEMORY_GATE_HIGH": "0.9", "LANES_MEMORY_GATE_LOW": "0.7", "LANES_MEMORY_GATE_CGROUP": str(cgroup)}
    dep = deploy(tmp_path / "state", url, DOC, [SimModel(name="m", ttft_ms=5, per_token_ms=1, tokens=4)], ["gpu"],
                 extra_env=env)
    yield dep, cgroup
    dep.close()


def gate_info(dep) -> dict:
    """The gate of each of the fleet's processes (foreground, background) when all
    agree on whether they consume, each one's own record; else {}."""
    stats = dep.client.celery.control.inspect(timeout=1.0).stats() or {}
    gates = [s.get("memory_gate", {}) for name, s in stats.items() if name.startswith("gpu@")]
    if len(gates) != 2 or len({gate.get("consuming") for gate in gates}) != 1:
        return {}
    return {"consuming": gates[0].get("consuming"), "gates": gates}


def test_a_worker_above_the_high_mark_takes_no_new_tasks_and_resumes_below_the_low_mark(gated):
    dep, cgroup = gated
    assert dep.client.submit("chat", CHAT).get(timeout=60)  # the gate is open at 50 %
    served = dep.sim.stats()["m"]["served"]

    set_memory(cgroup, 950)  # 95 % of the limit: above the high mark
    info = eventually(lambda: (i := gate_info(dep)).get("consuming") is False and i, timeout=30,
                      interval=0.2, what="the gate engaged and the consumer switched off")
    for gate in info["gates"]:  # each process gates itself
        assert gate["engaged"] and gate["engagements"] == 1 and gate["ratio"] == pytest.approx(0.95)

    waiting = [dep.client.submit("chat", CHAT), dep.client.submit("chat", CHAT, priority="background")]
    # Three polls of the gate (one a second): an idle worker above the high mark stays shut.
    time.sleep(3.0)
    assert not any(result.ready() for result in waiting)
    assert dep.sim.stats()["m"]["served"] == served
    set_memory(cgroup, 800)  # between the marks: still shut
    time.sleep(2.0)
    assert not any(result.ready() for result in waiting)

    set_memory(cgroup, 600)  # below the low mark: the foreground and the background queues come back
    for result in waiting:
        assert result.get(timeout=60)
    assert dep.sim.stats()["m"]["served"] == served + 2
    info = eventually(lambda: (i := gate_info(dep)).get("consuming") is True and i, timeout=30, interval=0.2,
                      what="both gates open")
    for gate in info["gates"]:
        assert not gate["engaged"] and gate["engagements"] == 1

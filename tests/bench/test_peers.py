"""The peer benchmark's parts (bench/bench_peers.py): its figures, its CPU
accounting, and its arms against the real simulator, Redis and workers.

The arms' tests judge counts and invariants, never speed: what a backend saw
at once against its width, and that every request of a scenario comes back
with an outcome.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import missing_service

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from peers_celery import TICKS, PlainCeleryArm, process_tree_cpu  # noqa: E402
from peers_lanes import LanesArm  # noqa: E402
from peers_litellm import LiteLLMArm, available  # noqa: E402
from peers_workload import WIDTH, Outcome, Request, Scenario, figures  # noqa: E402

from tests.e2e.harness import RemoteSim  # noqa: E402

# A call long enough that a burst's calls overlap at the backend whatever the machine's load.
SLOW_SPECS = [f"primary:{WIDTH}:1000", f"fallback:{WIDTH}:1000"]


def _stats(**per_model) -> dict:
    zero = {"max_in_flight": 0, "served": 0, "rejected": 0, "failed": 0, "cancelled": 0}
    return {m: {**zero, **per_model.get(m, {})} for m in ("primary", "fallback")}


def test_figures_count_failures_by_reason_and_late_answers_miss_the_deadline():
    scenario = Scenario("s", (Request(0, "interactive", 0.0, 1.0), Request(1, "interactive", 0.0, 1.0),
                              Request(2, "background", 0.0, 9.0), Request(3, "interactive", 0.0, 1.0)))
    outcomes = [
        Outcome(0, "interactive", 100.0, 100.5, True),
        Outcome(1, "interactive", 100.0, 102.0, True),  # answered, but after its 1 s deadline
        Outcome(2, "background", 100.0, 105.0, True),
        Outcome(3, "interactive", 100.0, 100.1, False, "429 max_parallel_requests (router)"),
    ]
    stats = _stats(primary={"max_in_flight": 8, "served": 3, "rejected": 2}, fallback={"failed": 1})

    row = figures(outcomes, 4, stats, cpu_seconds=0.2, scenario=scenario)

    assert row["failed"] == {"429 max_parallel_requests (router)": 1}
    assert row["answered_within_deadline"] == 2
    assert row["max_in_flight"] == {"primary": 8, "fallback": 0}
    assert row["backend_calls_per_request"] == 1.5  # 3 served + 2 rejected + 1 failed, over 4 requests
    assert row["interactive_p50_ms"] == 1250.0  # of the answered interactive ones: 0.5 s and 2 s
    assert row["cpu_ms_per_request"] == 50.0


def test_the_cpu_of_a_process_tree_includes_its_childrens():
    # A shell whose child burns CPU, reports it, and waits to be told to exit.
    burner = ("import sys, time\n"
              "sum(i * i for i in range(10_000_000))\n"
              "print(time.process_time(), flush=True)\n"
              "sys.stdin.readline()\n")
    parent = subprocess.Popen(["sh", "-c", f'{sys.executable} -c "$0"', burner],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        child_cpu = float(parent.stdout.readline())
        # /proc counts CPU in clock ticks, sampled (0.11 s against the process's own 0.128 s
        # once, on a busy machine): a few ticks of slack beside the 10 %.
        assert process_tree_cpu([parent.pid]) >= child_cpu * 0.9 - 3 / TICKS
    finally:
        parent.communicate("\n", timeout=30)


def _burst(size: int) -> list[Request]:
    return [Request(i, "interactive", 0.0, 120.0) for i in range(size)]


@pytest.fixture
def slow_sim():
    sim = RemoteSim(SLOW_SPECS)
    yield sim
    sim.stop()


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_litellm_routers_in_two_processes_send_a_backend_more_than_its_width(slow_sim, one_redis_url):
    if available() is None:
        missing_service("LiteLLM is not installed (the peers extra: pip install -e '.[peers]')")
    arm = LiteLLMArm(2, slow_sim.base_url, one_redis_url)
    try:
        outcomes, cpu = arm.run(_burst(4 * WIDTH), time.time() + 0.5)
    finally:
        arm.close()
    assert sorted(o.index for o in outcomes) == list(range(4 * WIDTH))
    assert cpu > 0
    # Each process keeps its own max_parallel_requests count: together they exceed the width.
    assert slow_sim.stats()["primary"]["max_in_flight"] > WIDTH


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_lanes_with_two_workers_never_sends_a_backend_more_than_its_width(slow_sim, one_redis_url, tmp_path):
    arm = LanesArm(2, one_redis_url, tmp_path / "lanes", slow_sim)
    try:
        outcomes, cpu = arm.run(_burst(3 * WIDTH), time.time() + 0.5)
    finally:
        arm.close()
    assert sorted(o.index for o in outcomes) == list(range(3 * WIDTH))
    assert all(o.ok for o in outcomes), [o.reason for o in outcomes if not o.ok]
    assert cpu > 0
    stats = slow_sim.stats()
    assert stats["primary"]["max_in_flight"] <= WIDTH
    assert stats["fallback"]["max_in_flight"] <= WIDTH


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_plain_celery_fails_every_request_while_the_primary_is_down(slow_sim, one_redis_url, tmp_path):
    slow_sim.configure("primary", down=True, keep_alive_on_engine_death=True)
    arm = PlainCeleryArm(one_redis_url, tmp_path, slow_sim)
    try:
        outcomes, _ = arm.run(_burst(3), time.time() + 0.5)
    finally:
        arm.close()
    assert [o.ok for o in outcomes] == [False] * 3
    assert {o.reason for o in outcomes} == {"BackendError"}


def test_the_benchmark_refuses_to_run_without_litellm_when_every_arm_is_required(monkeypatch, capsys):
    import bench_peers

    monkeypatch.setattr(bench_peers, "available", lambda: None)
    monkeypatch.setenv("LANES_BENCH_REQUIRE_PEERS", "1")
    monkeypatch.setattr(sys, "argv", ["bench_peers.py", "--smoke"])

    assert bench_peers.main() == 2
    assert "install the peers extra (pip install -e '.[peers]')" in capsys.readouterr().err

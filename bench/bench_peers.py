"""Lanes against the router people use today (LiteLLM's Router) and plain
Celery: the same fleet, the same simulator, the same workload, in one run.

    python bench/bench_peers.py            # full run (3 rounds, every arm)
    python bench/bench_peers.py --smoke    # a quick pass that proves it runs

The fleet: a primary and a fallback pool, each of width 4, on the simulator
(``lanes sim``, its own process) at capacity 4 and 200 ms per call, queueing
what is over its limit as vLLM does. Arms: LiteLLM's Router from 1, 2 and 4
processes (peers_litellm.py), Lanes with 1, 2 and 4 fleet workers
(peers_lanes.py), plain Celery with a thread per slot of the primary
(peers_celery.py). Scenarios (peers_workload.py): a mixed burst (a background
backlog, interactive requests arriving during it), a primary outage mid-run,
and a burst bigger than the primary with an idle fallback (deadline-bound).
In each round every arm starts, runs the three scenarios and stops, the arms
taking turns in an order rotated round by round, so a slow spell of a shared
machine falls on all of them.

Reported side by side, per scenario: the highest concurrency each backend
saw against its width, requests failed (by reason), interactive p50/p99 (sent
to answer) and its ratio to plain Celery's, answers within the deadline,
backend calls per request, and CPU milliseconds per request of the routing
layer (the router processes; Lanes' and Celery's worker processes).

LiteLLM comes from the optional ``peers`` extra (``pip install -e '.[peers]'``).
Without it the LiteLLM arms are left out with a notice, unless
``LANES_BENCH_REQUIRE_PEERS=1`` (as CI sets it), which makes that an error.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from importlib.metadata import version
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lanes.embedded import EmbeddedRedis  # noqa: E402
from peers_celery import PlainCeleryArm  # noqa: E402
from peers_lanes import LanesArm  # noqa: E402
from peers_litellm import LiteLLMArm, available  # noqa: E402
from peers_table import markdown  # noqa: E402
from peers_workload import MODELS, SIM_SPECS, Scenario, figures, scenarios  # noqa: E402
from routing_setup import Bench  # noqa: E402
from tests.e2e.harness import RemoteSim  # noqa: E402

FULL_ARMS = ("litellm_1p", "litellm_2p", "litellm_4p", "lanes_1w", "lanes_2w", "lanes_4w", "plain_celery")
# One LiteLLM process in the smoke run: importing LiteLLM costs ~5 CPU seconds a process.
SMOKE_ARMS = ("litellm_1p", "lanes_1w", "plain_celery")
COUNTERS = ("served", "rejected", "failed", "cancelled")


def make_arm(name: str, bench: Bench, sim: RemoteSim):
    kind, _, size = name.partition("_")
    if kind == "litellm":
        return LiteLLMArm(int(size[:-1]), sim.base_url, bench.next_url())
    if kind == "lanes":
        url = bench.next_url()
        return LanesArm(int(size[:-1]), url, bench.work / f"{name}-{url.rsplit('/', 1)[1]}-{time.time_ns()}", sim)
    return PlainCeleryArm(bench.next_url(), bench.work, sim)


def wait_idle(sim: RemoteSim, timeout: float = 120.0) -> None:
    """Until neither model has a call in flight (a cut-off caller's call still runs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = sim.stats()
        if all(stats[m]["in_flight"] == 0 for m in MODELS):
            return
        time.sleep(0.1)
    raise RuntimeError(f"the simulator still has calls in flight after {timeout:.0f}s")


def run_case(arm, scenario: Scenario, sim: RemoteSim) -> tuple[list, float, dict]:
    wait_idle(sim)
    # A dead engine that answers 500 per request and stays (vLLM's
    # VLLM_KEEP_ALIVE_ON_ENGINE_DEATH): the two models share the simulator's
    # port, which an exiting server would close for the fallback too.
    sim.configure("primary", down=False, keep_alive_on_engine_death=True)
    sim.reset()
    start_at = time.time() + 0.5
    timers = []
    if scenario.outage:
        for moment, down in zip(scenario.outage, (True, False)):
            timer = threading.Timer(start_at + moment - time.time(), sim.configure, ("primary",), {"down": down})
            timer.start()
            timers.append(timer)
    try:
        outcomes, cpu = arm.run(list(scenario.requests), start_at)
    finally:
        for timer in timers:
            timer.join()
    wait_idle(sim)
    stats = sim.stats()
    return outcomes, cpu, {m: {k: stats[m][k] for k in ("max_in_flight", *COUNTERS)} for m in MODELS}


def merge(into: dict, outcomes: list, cpu: float, stats: dict, requests: int) -> None:
    into.setdefault("outcomes", []).extend(outcomes)
    into["requests"] = into.get("requests", 0) + requests
    into["cpu"] = into.get("cpu", 0.0) + cpu
    merged = into.setdefault("stats", {m: {"max_in_flight": 0, **{k: 0 for k in COUNTERS}} for m in MODELS})
    for m in MODELS:
        merged[m]["max_in_flight"] = max(merged[m]["max_in_flight"], stats[m]["max_in_flight"])
        for k in COUNTERS:
            merged[m][k] += stats[m][k]


def versions(url: str) -> dict:
    return {
        "python": platform.python_version(),
        "lanes": version("lanes"),
        "celery": version("celery"),
        "litellm": available(),
        "redis_server": redis.Redis.from_url(url).info("server")["redis_version"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="small sizes, one round, fewer arms: proves it runs")
    parser.add_argument("--rounds", type=int, help="rounds of every arm (default 3; 1 with --smoke)")
    parser.add_argument("--arms", nargs="+", choices=FULL_ARMS, help="run only these arms")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.smoke else 3)
    if rounds < 1:
        parser.error(f"--rounds {rounds}: give at least 1")
    arms = list(args.arms or (SMOKE_ARMS if args.smoke else FULL_ARMS))
    if available() is None:
        message = "LiteLLM is not installed: install the peers extra (pip install -e '.[peers]')"
        if os.environ.get("LANES_BENCH_REQUIRE_PEERS") == "1":
            print(f"error: {message}; LANES_BENCH_REQUIRE_PEERS=1 asks for every arm", file=sys.stderr)
            return 2
        print(f"notice: {message}; the LiteLLM arms are left out", flush=True)
        arms = [a for a in arms if not a.startswith("litellm")]
    cases = scenarios(args.smoke)
    results: dict[str, dict[str, dict]] = {s.name: {a: {} for a in arms} for s in cases}

    with tempfile.TemporaryDirectory(prefix="lanes-peers-") as tmp:
        work = Path(tmp)
        server = EmbeddedRedis(work / "redis")
        url = server.ensure().rsplit("/", 1)[0]
        sim = RemoteSim(SIM_SPECS)
        try:
            bench = Bench(url, work)
            about = versions(url + "/0")
            for turn in range(rounds):
                order = arms[turn % len(arms):] + arms[:turn % len(arms)]
                for name in order:
                    started = time.monotonic()
                    arm = make_arm(name, bench, sim)
                    print(f"  {name} started in {time.monotonic() - started:.1f}s", flush=True)
                    try:
                        for scenario in cases:
                            began = time.monotonic()
                            outcomes, cpu, stats = run_case(arm, scenario, sim)
                            print(f"  {name} {scenario.name}: {time.monotonic() - began:.1f}s", flush=True)
                            merge(results[scenario.name][name], outcomes, cpu, stats, len(scenario.requests))
                    finally:
                        closing = time.monotonic()
                        arm.close()
                        print(f"  {name} stopped in {time.monotonic() - closing:.1f}s", flush=True)
                    print(f"round {turn + 1}/{rounds}: {name} done in {time.monotonic() - started:.0f}s", flush=True)
        finally:
            sim.stop()
            server.stop()

    table = {s.name: {a: figures(r["outcomes"], r["requests"], r["stats"], r["cpu"], s)
                      for a, r in results[s.name].items()} for s in cases}
    for rows in table.values():
        base = rows.get("plain_celery", {}).get("interactive_p99_ms")
        for row in rows.values():
            if base and row["interactive_p99_ms"] is not None:
                row["interactive_p99_vs_plain_celery"] = round(row["interactive_p99_ms"] / base, 3)
    out = {"versions": about, "rounds": rounds, "smoke": args.smoke,
           "scenarios": {s.name: {"requests": len(s.requests), "outage_s": s.outage} for s in cases},
           "figures": table}
    print(json.dumps(out, indent=2))
    print(markdown(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

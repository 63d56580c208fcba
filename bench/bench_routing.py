"""Routing benchmarks: routed Lanes work against plain Celery, in one run.

    python bench/bench_routing.py            # full run (about 25 minutes)
    python bench/bench_routing.py --smoke    # a quick pass that proves it runs

Every figure is a ratio against a baseline measured in the same run on the
same machine (its own Redis server, the simulator in its own process):

1. throughput: the simulator at capacity W in queue mode, 50 ms service;
   routed tasks vs plain Celery tasks calling it directly with as many
   threads as the fleet runs for the routed work's queue (like with like);
   plain Celery with W threads (one per slot) beside it, for reference.
   Target >= 0.85x; also the added milliseconds of slot time per task.
2. priority: submit-to-admission time of interactive work; p99 with a 10 x W
   background backlog vs p99 with the lane saturated by exactly W closed-loop
   background clients, the two cases taking turns. Target <= 1.25x. Plain FIFO
   Celery's ratio beside it; and each case's admissions grouped by how much
   background work turned over on the worker (calls beginning or ending)
   while the request was on its way.
3. utilisation: lognormal service (mean 200 ms), saturating load; the
   simulator's own running count averaged over the steady state / W.
   Target >= 0.95, and zero over-admission.
4. events: routed throughput with routing events on vs off. Target >= 0.97x.
5. background: a background backlog drained against the backend's ideal and
   plain Celery; 6. mixed: interactive bursts during a background backlog
   (both in routing_background.py). Target >= 0.95 of the ideal / of W.

``--only background mixed`` runs some scenarios only.
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lanes.embedded import EmbeddedRedis  # noqa: E402
from routing_background import background_backlog, mixed_load  # noqa: E402
from routing_setup import (CHAT, W, Bench, ClosedLoop, LanesLoad, Plain, PlainLoad, fleet_threads, p,  # noqa: E402
                           settle, wait_ready)
from tests.e2e.harness import RemoteSim  # noqa: E402


# --- 1. throughput -----------------------------------------------------------------------


def burst(submit, n: int) -> float:
    start = time.monotonic()
    results = [submit() for _ in range(n)]
    wait_ready(results)
    return time.monotonic() - start


def throughput(bench: Bench, n: int, rounds: int) -> dict:
    sim = RemoteSim([f"m:{W}:50"])
    try:
        dep = bench.deploy(sim, W)
        threads = fleet_threads(dep)  # the foreground queue's, which takes the "tool" work
        plain = bench.plain(sim, threads)
        plain_w = bench.plain(sim, W, queue="plain-w")
        try:
            routed_s, plain_s, plain_w_s = [], [], []
            burst(lambda: dep.client.submit("tool", CHAT), max(8, n // 10))  # warm every path
            burst(lambda: plain.submit(sim), max(8, n // 10))
            burst(lambda: plain_w.submit(sim), max(8, n // 10))
            sim.reset()
            routed_over = plain_over = 0
            for _ in range(rounds):
                sim.reset()
                routed_s.append(burst(lambda: dep.client.submit("tool", CHAT), n))
                routed_over = max(routed_over, sim.stats()["m"]["max_in_flight"])
                sim.reset()
                plain_s.append(burst(lambda: plain.submit(sim), n))
                plain_over = max(plain_over, sim.stats()["m"]["max_in_flight"])
                plain_w_s.append(burst(lambda: plain_w.submit(sim), n))
        finally:
            plain.close()
            plain_w.close()
            dep.close()
    finally:
        sim.stop()
    ratios = [ps / rs for rs, ps in zip(routed_s, plain_s)]
    ratios_w = [ps / rs for rs, ps in zip(routed_s, plain_w_s)]
    routed, plain_t = statistics.median(routed_s), statistics.median(plain_s)
    return {
        "tasks": n,
        "rounds": rounds,
        "fleet_threads": threads,
        "routed_tasks_per_s": round(n / routed, 1),
        "plain_tasks_per_s": round(n / plain_t, 1),
        "ideal_tasks_per_s": round(W / 0.050, 1),
        "ratio_median": round(statistics.median(ratios), 3),
        "ratios": [round(r, 3) for r in ratios],
        "added_ms_per_task": round((routed - plain_t) * W / n * 1000, 2),
        "max_in_flight_seen": routed_over,
        "plain_max_in_flight_seen": plain_over,
        "reference_plain_w_threads": W,
        "reference_plain_w_tasks_per_s": round(n / statistics.median(plain_w_s), 1),
        "reference_ratio_vs_plain_w_median": round(statistics.median(ratios_w), 3),
        "target": ">= 0.85 (against plain Celery with fleet_threads threads)",
    }


# --- 2. priority --------------------------------------------------------------------------


def routed_admission(dep, samples: int, rng: random.Random) -> dict[str, list[float]]:
    """Submit-to-admission of each request, and its parts: publish (the
    client's submit call), delivery (submit to the walk's start: publish,
    broker and worker) and the wait in the lane; ``asked`` holds the
    admissions that asked a background holder for its slot (1.0) and those
    that found one free (0.0)."""
    parts: dict[str, list[float]] = {"admission": [], "publish": [], "delivery": [], "lane_wait": [], "asked": [],
                                     "sent": []}
    for _ in range(samples):
        time.sleep(rng.uniform(0.1, 0.3))
        sent = time.time()
        parts["sent"].append(sent)
        result = dep.client.submit("inter", CHAT, deadline=120)
        parts["publish"].append(time.time() - sent)
        # The figures come from the trace's own timestamps; the poll only ends the sample.
        wait_ready([result], poll=0.02)
        trace = result.result["trace"]
        served = trace["steps"][-1]
        parts["admission"].append(served["admitted_at"] - sent)
        parts["delivery"].append(trace["started_at"] - sent)
        parts["lane_wait"].append(served["wait_ms"] / 1000)
        parts["asked"].append(1.0 if served.get("asked_yield") else 0.0)
    return parts


def background_calls(dep) -> list[float]:
    """When each background call served in the deployment began and ended
    (epoch seconds, sorted), from the routing traces in the stored results."""
    moments = []
    with redis.Redis.from_url(dep.redis_url) as client:
        keys = list(client.scan_iter(match="celery-task-meta-*", count=1000))
        values = [v for i in range(0, len(keys), 1000) for v in client.mget(keys[i:i + 1000])]
    for value in values:
        result = json.loads(value).get("result") if value else None
        trace = result.get("trace") if isinstance(result, dict) else None
        if not trace or trace.get("priority") != "background":
            continue
        for step in trace["steps"]:
            if step.get("admitted_at") and step.get("call_ms") is not None:
                moments += [step["admitted_at"], step["admitted_at"] + step["call_ms"] / 1000]
    return sorted(moments)


def turnover_near(parts: dict[str, list[float]], moments: list[float]) -> dict:
    """Admissions by how many background calls of the same fleet began or
    ended between 15 ms before the request was sent and its admission: the
    background work turning over on the worker while the request was on its
    way. Per group: samples, admission p50 / p99, and its share of the case's
    slowest 3 %."""
    slow = p(parts["admission"], 97)
    groups: dict[str, list[float]] = {"none": [], "1-2": [], "3+": []}
    for sent, admission in zip(parts["sent"], parts["admission"]):
        near = bisect.bisect(moments, sent + admission) - bisect.bisect(moments, sent - 0.015)
        groups["none" if near == 0 else "1-2" if near <= 2 else "3+"].append(admission)
    slowest = sum(1 for a in parts["admission"] if a >= slow)
    return {name: {"samples": len(values),
                   "p50_p99_ms": [round(p(values, q) * 1000, 1) for q in (50, 99)] if values else None,
                   "share_of_slowest_3pct": round(sum(1 for a in values if a >= slow) / slowest, 3)}
            for name, values in groups.items()}


def plain_admission(plain: Plain, sim: RemoteSim, samples: int, rng: random.Random) -> list[float]:
    delays = []
    for _ in range(samples):
        time.sleep(rng.uniform(0.1, 0.3))
        sent = time.time()
        result = plain.submit(sim)
        wait_ready([result], poll=0.02)
        delays.append(result.result["started_at"] - sent)
    return delays


def ratio_interval(top: list[float], bottom: list[float], draws: int = 1000) -> list[float]:
    """The p99 ratio's 5th and 95th percentiles over bootstrap resamples of
    both cases: how far the top few samples of each can move the figure."""
    rng = random.Random(7)
    ratios = sorted(
        p(rng.choices(top, k=len(top)), 99) / p(rng.choices(bottom, k=len(bottom)), 99) for _ in range(draws)
    )
    return [round(ratios[int(draws * 0.05)], 3), round(ratios[int(draws * 0.95) - 1], 3)]


def priority(bench: Bench, samples: int, fifo_samples: int, turns: int) -> dict:
    sim = RemoteSim([f"m:{W}:200"])
    out: dict = {"samples": samples, "fifo_samples": fifo_samples, "width": W, "service_ms": 200,
                 "target": "<= 1.25"}
    try:
        dep = bench.deploy(sim, W)
        try:
            # The two cases take turns, ``samples / turns`` at a time, so that a
            # slow spell of a shared machine (tens of seconds) falls on both, not on one.
            merged: dict[str, dict[str, list[float]]] = {"saturated": {}, "backlog": {}}
            for turn in range(turns):
                for case, clients in (("saturated", W), ("backlog", 11 * W)):
                    load = ClosedLoop(LanesLoad.of(dep, "bg"), clients)
                    settle(sim, lambda s: s["running"] == W, what="a lane full of background calls")
                    time.sleep(1.0)
                    parts = routed_admission(dep, samples // turns, random.Random(turn))
                    load.stop()  # raises if the load died meanwhile
                    for part, values in parts.items():
                        merged[case].setdefault(part, []).extend(values)
                    settle(sim, lambda s: s["in_flight"] == 0, timeout=60)
            for case, parts in merged.items():
                out[f"routed_{case}_p50_ms"] = round(p(parts["admission"], 50) * 1000, 1)
                out[f"routed_{case}_p99_ms"] = round(p(parts["admission"], 99) * 1000, 1)
                for part in ("publish", "delivery", "lane_wait"):
                    out[f"routed_{case}_{part}_p50_p99_ms"] = [round(p(parts[part], q) * 1000, 1) for q in (50, 99)]
                out[f"routed_{case}_admitted_at_once"] = round(
                    sum(1 for w in parts["lane_wait"] if w < 0.002) / len(parts["lane_wait"]), 3)
                # A lane kept full by W closed-loop clients still has a slot
                # free between one client's answer and its next task; a
                # backlog never does. Like with like: the admissions that had
                # to ask a background holder for its slot, in each case.
                asked = [a for a, flag in zip(parts["admission"], parts["asked"]) if flag]
                out[f"routed_{case}_asked_yield_share"] = round(len(asked) / len(parts["asked"]), 3)
                out[f"routed_{case}_asked_yield_p50_p99_ms"] = (
                    [round(p(asked, q) * 1000, 1) for q in (50, 99)] if asked else None)
            out["max_in_flight_seen"] = sim.stats()["m"]["max_in_flight"]
            moments = background_calls(dep)
            for case, parts in merged.items():
                out[f"routed_{case}_background_turnover_near"] = turnover_near(parts, moments)
        finally:
            dep.close()
        plain = bench.plain(sim, W, queue="fifo")
        try:
            for case, clients in (("saturated", W), ("backlog", 11 * W)):
                load = ClosedLoop(PlainLoad.of(plain, sim), clients)
                settle(sim, lambda s: s["running"] == W, what="a backend full of plain calls")
                time.sleep(1.0)
                delays = plain_admission(plain, sim, fifo_samples, random.Random(1))
                load.stop()
                out[f"fifo_{case}_p50_ms"] = round(p(delays, 50) * 1000, 1)
                out[f"fifo_{case}_p99_ms"] = round(p(delays, 99) * 1000, 1)
                settle(sim, lambda s: s["in_flight"] == 0, timeout=120)
        finally:
            plain.close()
    finally:
        sim.stop()
    out["routed_ratio_p99"] = round(out["routed_backlog_p99_ms"] / out["routed_saturated_p99_ms"], 3)
    out["routed_ratio_p99_interval_90"] = ratio_interval(merged["backlog"]["admission"],
                                                         merged["saturated"]["admission"])
    if out.get("routed_saturated_asked_yield_p50_p99_ms") and out.get("routed_backlog_asked_yield_p50_p99_ms"):
        out["routed_ratio_p99_asked_yield"] = round(
            out["routed_backlog_asked_yield_p50_p99_ms"][1] / out["routed_saturated_asked_yield_p50_p99_ms"][1], 3)
    # Without preemption (docs/SCHEDULING.md, "Urgent work takes a background slot") a lane kept
    # full would admit an urgent request only at the next release: with W calls of a
    # fixed service S at independent phases, the wait exceeds t with probability
    # (1 - t/S)^W, so its p99 is S * (1 - 0.01^(1/W)) (137 ms at W=4, S=200 ms).
    out["full_lane_wait_p99_bound_ms"] = round(200 * (1 - 0.01 ** (1 / W)), 1)
    out["fifo_ratio_p99"] = round(out["fifo_backlog_p99_ms"] / out["fifo_saturated_p99_ms"], 3)
    return out


# --- 3. utilisation ------------------------------------------------------------------------


def utilisation(bench: Bench, seconds: float, width: int = W) -> dict:
    sim = RemoteSim([f"m:{width}:200"], extra_args=("--distribution", "lognormal", "--sigma", "0.5", "--seed", "3"))
    try:
        dep = bench.deploy(sim, width)
        try:
            needed = int((seconds + 6) * width / 0.2 * 1.3)
            results = [dep.client.submit("tool", CHAT) for _ in range(needed)]
            settle(sim, lambda s: s["running"] == width)
            time.sleep(1.0)  # past the start: measure the steady state only
            samples = []
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                samples.append(sim.stats()["m"]["running"])
                time.sleep(0.01)
            stats = sim.stats()["m"]
            pending = sum(1 for r in results if not r.ready())
            for r in results:
                r.forget()
        finally:
            dep.close()
    finally:
        sim.stop()
    return {
        "width": width,
        "samples": len(samples),
        "still_queued_at_end": pending,
        "mean_running": round(statistics.fmean(samples), 3),
        "utilisation": round(statistics.fmean(samples) / width, 3),
        "max_running": stats["max_running"],
        "max_in_flight": stats["max_in_flight"],
        "over_admitted": stats["max_in_flight"] > width,
        "target": ">= 0.95, max_in_flight <= width",
    }


# --- 4. events on vs off ------------------------------------------------------------------


def events_overhead(bench: Bench, n: int, rounds: int) -> dict:
    sim = RemoteSim([f"m:{W}:50"])
    on, off = [], []
    try:
        for _ in range(rounds):
            for enabled, into in ((True, on), (False, off)):
                dep = bench.deploy(sim, W, events_enabled=enabled)
                try:
                    burst(lambda: dep.client.submit("tool", CHAT), max(8, n // 10))
                    into.append(burst(lambda: dep.client.submit("tool", CHAT), n))
                finally:
                    dep.close()
    finally:
        sim.stop()
    ratios = [f / o for o, f in zip(on, off)]
    return {
        "tasks": n,
        "rounds": rounds,
        "events_on_tasks_per_s": round(n / statistics.median(on), 1),
        "events_off_tasks_per_s": round(n / statistics.median(off), 1),
        "ratio_median": round(statistics.median(ratios), 3),
        "target": ">= 0.97",
    }


SCENARIOS = ("throughput", "priority", "utilisation", "events", "background", "mixed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="small sizes, one round: proves the benchmark runs")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, help="run only these scenarios")
    args = parser.parse_args()
    n, rounds, samples, seconds = (40, 1, 8, 3.0) if args.smoke else (400, 3, 60, 12.0)
    backlogs = {50: 40, 200: 16} if args.smoke else {50: 400, 200: 100}
    scenarios = {
        "throughput": lambda bench: throughput(bench, n, rounds),
        # A p99 rests on the top 1 % of its samples: 960 per case, so on ten of them, in
        # eight turns. Two cases drawn from one lognormal (sigma 0.5) have p99s 1.20x apart
        # or more one time in twenty at 480 samples each, 1.14x at 960; the scenario prints
        # the interval of its own figure. Plain FIFO's backlog case takes seconds a sample.
        "priority": lambda bench: priority(bench, 64 if args.smoke else 960, samples, turns=2 if args.smoke else 8),
        "utilisation": lambda bench: utilisation(bench, seconds),
        "events": lambda bench: events_overhead(bench, n, rounds),
        "background": lambda bench: background_backlog(bench, backlogs),
        "mixed": lambda bench: mixed_load(bench, samples // 2, seconds),
    }

    with tempfile.TemporaryDirectory(prefix="lanes-bench-") as tmp:
        work = Path(tmp)
        server = EmbeddedRedis(work / "redis")
        url = server.ensure().rsplit("/", 1)[0]
        try:
            bench = Bench(url, work)
            figures = {}
            for name, run in scenarios.items():
                if not args.only or name in args.only:
                    figures[name] = run(bench)
                    print(json.dumps({name: figures[name]}), flush=True)  # each scenario's figures as it ends
        finally:
            server.stop()
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

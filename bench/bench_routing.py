"""Routing benchmarks: routed Lanes work against plain Celery, in one run.

    python bench/bench_routing.py            # full run (about 5 minutes)
    python bench/bench_routing.py --smoke    # a quick pass that proves it runs

Every figure is a ratio against a baseline measured in the same run on the
same machine (its own Redis server, the simulator in its own process):

1. throughput: the simulator at capacity W in queue mode, 50 ms service;
   routed tasks vs plain Celery tasks calling it directly with W workers.
   Target >= 0.85x; also the added milliseconds of slot time per task.
2. priority: submit-to-admission time of interactive work; p99 with a 10 x W
   background backlog vs p99 with the lane saturated by exactly W closed-loop
   background clients. Target <= 1.25x. Plain FIFO Celery's ratio beside it.
3. utilisation: lognormal service (mean 200 ms), saturating load; the
   simulator's own running count averaged over the steady state / W.
   Target >= 0.95, and zero over-admission.
4. events: routed throughput with routing events on vs off. Target >= 0.97x.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from lanes.celery_client import make_celery  # noqa: E402
from lanes.embedded import EmbeddedRedis  # noqa: E402
from lanes.settings import Settings  # noqa: E402
from tests.e2e.harness import RemoteSim, deploy  # noqa: E402

PLAIN_TASK = "bench.plain_call"
CHAT = {"messages": [{"role": "user", "content": "bench"}], "max_tokens": 1}
W = 4


def catalog(width: int) -> dict:
    return {
        "pools": [{"name": "p", "width": width, "ceiling": max(width, 64)}],
        "models": [{"name": "m", "base_url": "{sim}", "pool": "p", "timeout_ms": 120_000}],
        "workflows": [
            {"name": "tool", "priority": "user_tool", "candidates": ["m"]},
            {"name": "inter", "priority": "interactive", "candidates": ["m"]},
            {"name": "bg", "priority": "background", "candidates": ["m"]},
        ],
    }


class Bench:
    def __init__(self, base_url: str, work: Path) -> None:
        self.base_url = base_url
        self.work = work
        self._db = 0

    def next_url(self) -> str:
        self._db += 1
        url = f"{self.base_url}/{self._db}"
        redis.Redis.from_url(url).flushdb()
        return url

    def deploy(self, sim: RemoteSim, width: int, **settings):
        return deploy(self.work / f"d{self._db + 1}", self.next_url(), catalog(width), sim, ["p"], **settings)

    def plain(self, sim: RemoteSim, concurrency: int, queue: str = "plain") -> "Plain":
        return Plain(self.next_url(), self.work, concurrency, queue)


class Plain:
    """The baseline: plain Celery tasks on one FIFO queue, calling the simulator."""

    def __init__(self, redis_url: str, work: Path, concurrency: int, queue: str) -> None:
        self.settings = Settings(state_dir=work / "plain", redis_url=redis_url)
        self.app = make_celery(self.settings, redis_url, main="plain-client")
        self.queue = queue
        env = {"LANES_REDIS_URL": redis_url, "LANES_STATE_DIR": str(work / "plain"), "PATH": "/usr/bin:/bin"}
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "plain_worker.py"), "--concurrency", str(concurrency), "--queue", queue],
            env=env, cwd=ROOT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.app.control.ping(timeout=0.5):
                return
        raise RuntimeError("plain worker did not start")

    def submit(self, sim: RemoteSim):
        return self.app.send_task(PLAIN_TASK, args=[sim.base_url, "m", CHAT], queue=self.queue)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.app.close()


def wait_ready(results, timeout: float = 600.0, poll: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    pending = list(results)
    while pending and time.monotonic() < deadline:
        pending = [r for r in pending if not r.ready()]
        if pending:
            time.sleep(poll)
    if pending:
        raise RuntimeError(f"{len(pending)} tasks did not finish")
    failed = [r for r in results if not r.successful()]
    if failed:
        raise RuntimeError(f"{len(failed)} tasks failed, e.g. {failed[0].result!r}")


def p(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


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
        plain = bench.plain(sim, W)
        try:
            routed_s, plain_s = [], []
            burst(lambda: dep.client.submit("tool", CHAT), max(8, n // 10))  # warm both paths
            burst(lambda: plain.submit(sim), max(8, n // 10))
            sim.reset()
            for _ in range(rounds):
                routed_s.append(burst(lambda: dep.client.submit("tool", CHAT), n))
                plain_s.append(burst(lambda: plain.submit(sim), n))
            over = sim.stats()["m"]["max_in_flight"]
        finally:
            plain.close()
            dep.close()
    finally:
        sim.stop()
    ratios = [ps / rs for rs, ps in zip(routed_s, plain_s)]
    routed, plain_t = statistics.median(routed_s), statistics.median(plain_s)
    return {
        "tasks": n,
        "rounds": rounds,
        "routed_tasks_per_s": round(n / routed, 1),
        "plain_tasks_per_s": round(n / plain_t, 1),
        "ideal_tasks_per_s": round(W / 0.050, 1),
        "ratio_median": round(statistics.median(ratios), 3),
        "ratios": [round(r, 3) for r in ratios],
        "added_ms_per_task": round((routed - plain_t) * W / n * 1000, 2),
        "max_in_flight_seen": over,
        "target": ">= 0.85",
    }


# --- 2. priority --------------------------------------------------------------------------


class ClosedLoop:
    """``clients`` threads, each submitting one task and waiting for it, again and again."""

    def __init__(self, submit, clients: int) -> None:
        self._submit = submit
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            result = self._submit()
            while not self._stop.is_set() and not result.ready():
                time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def routed_admission(dep, samples: int, rng: random.Random) -> list[float]:
    delays = []
    for _ in range(samples):
        time.sleep(rng.uniform(0.1, 0.3))
        sent = time.time()
        result = dep.client.submit("inter", CHAT, deadline=120)
        wait_ready([result], poll=0.002)
        served = result.result["trace"]["steps"][-1]
        delays.append(served["admitted_at"] - sent)
    return delays


def plain_admission(plain: Plain, sim: RemoteSim, samples: int, rng: random.Random) -> list[float]:
    delays = []
    for _ in range(samples):
        time.sleep(rng.uniform(0.1, 0.3))
        sent = time.time()
        result = plain.submit(sim)
        wait_ready([result], poll=0.002)
        delays.append(result.result["started_at"] - sent)
    return delays


def settle(sim: RemoteSim, predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate(sim.stats()["m"]):
        time.sleep(0.05)


def priority(bench: Bench, samples: int) -> dict:
    sim = RemoteSim([f"m:{W}:200"])
    out: dict = {"samples": samples, "width": W, "service_ms": 200, "target": "<= 1.25"}
    try:
        dep = bench.deploy(sim, W)
        try:
            for case, clients in (("saturated", W), ("backlog", 11 * W)):
                load = ClosedLoop(lambda: dep.client.submit("bg", CHAT), clients)
                settle(sim, lambda s: s["running"] == W)
                time.sleep(1.0)
                delays = routed_admission(dep, samples, random.Random(1))
                load.stop()
                out[f"routed_{case}_p50_ms"] = round(p(delays, 50) * 1000, 1)
                out[f"routed_{case}_p99_ms"] = round(p(delays, 99) * 1000, 1)
                settle(sim, lambda s: s["in_flight"] == 0, timeout=60)
            out["max_in_flight_seen"] = sim.stats()["m"]["max_in_flight"]
        finally:
            dep.close()
        plain = bench.plain(sim, W, queue="fifo")
        try:
            for case, clients in (("saturated", W), ("backlog", 11 * W)):
                load = ClosedLoop(lambda: plain.submit(sim), clients)
                settle(sim, lambda s: s["running"] == W)
                time.sleep(1.0)
                delays = plain_admission(plain, sim, samples, random.Random(1))
                load.stop()
                out[f"fifo_{case}_p50_ms"] = round(p(delays, 50) * 1000, 1)
                out[f"fifo_{case}_p99_ms"] = round(p(delays, 99) * 1000, 1)
                settle(sim, lambda s: s["in_flight"] == 0, timeout=120)
        finally:
            plain.close()
    finally:
        sim.stop()
    out["routed_ratio_p99"] = round(out["routed_backlog_p99_ms"] / out["routed_saturated_p99_ms"], 3)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="small sizes, one round: proves the benchmark runs")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    n, rounds, samples, seconds = (40, 1, 8, 3.0) if args.smoke else (400, 3, 60, 12.0)

    with tempfile.TemporaryDirectory(prefix="lanes-bench-") as tmp:
        work = Path(tmp)
        server = EmbeddedRedis(work / "redis")
        url = server.ensure().rsplit("/", 1)[0]
        try:
            bench = Bench(url, work)
            figures = {
                "throughput": throughput(bench, n, rounds),
                "priority": priority(bench, samples),
                "utilisation": utilisation(bench, seconds),
                "events": events_overhead(bench, n, rounds),
            }
        finally:
            server.stop()
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every waiting request in the lane: fleet workers on the gevent pool against
the same workers on Celery's threads pool, in one run.

    python bench/bench_waiting.py            # burst, shares, in flight (minutes)
    python bench/bench_waiting.py --smoke    # a quick pass (CI)
    python bench/bench_waiting.py --only inflight --capacity 400 --pools gevent
                                             # a smaller in-flight case, to profile:
                                             # it prints the worker's pid for py-spy
                                             # (BENCH_WORKER_LOGLEVEL=INFO: the worker's log)

- burst: 40 interactive requests at once, 10 s deadlines (reserve 4 s), on a
  primary of width 2 serving in 3 s, a fallback of width 6 serving in 1 s, a
  hosted last candidate limited to 4 at once. Answers inside the deadline, and
  the most the primary saw at once (must not pass 2).
- shares: a width-2 pool, one user-tool workflow sends a burst, then another
  sends 10; the burst calls admitted before the small workflow's last one,
  against the small workflow's owed-share ideal (about one burst call each).
- in flight: one worker process, a backend of capacity N (1 s per request),
  3N requests: the most in flight at the backend in steady state, CPU seconds
  per request and the worker's resident memory, against the threads pool at
  its largest (64 threads per queue, the old cap) and against plain Celery on
  the gevent pool (no lanes: what one Celery process gives on the machine).
  ``--processes P`` shares the queue among P processes holding 1.5N/P each
  (N in flight, N/2 waiting in the lane), ``--service-ms`` sets the backend's
  time per request; Redis's CPU per request, peak memory, peak clients and
  connections accepted are reported too.

Each case runs through a real Redis (embedded), real supervised workers and
the simulator in a process of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from lanes.embedded import EmbeddedRedis  # noqa: E402
from tests.e2e.harness import RemoteSim, deploy  # noqa: E402

CHAT = {"messages": [{"role": "user", "content": "bench"}], "max_tokens": 1}

BURST_DOC = {
    "pools": [{"name": "dialog", "width": 2}, {"name": "utility", "width": 6}],
    "models": [
        {"name": "primary", "base_url": "{sim}", "pool": "dialog", "timeout_ms": 20000},
        {"name": "utility-14b", "base_url": "{sim}", "pool": "utility", "timeout_ms": 20000},
        {"name": "hosted-fallback", "base_url": "{sim}", "concurrency": 4, "timeout_ms": 20000},
    ],
    "workflows": [{"name": "dialog", "priority": "interactive", "reserve_ms": 4000,
                   "candidates": ["primary", "utility-14b", "hosted-fallback"]}],
}
BURST_SIM = ["primary:2:3000", "utility-14b:6:1000", "hosted-fallback:64:1000"]

SHARES_DOC = {
    "pools": [{"name": "tools", "width": 2}],
    "models": [{"name": "tool-model", "base_url": "{sim}", "pool": "tools", "timeout_ms": 60000}],
    "workflows": [{"name": "burst", "priority": "user_tool", "candidates": ["tool-model"]},
                  {"name": "small", "priority": "user_tool", "candidates": ["tool-model"]}],
}


def flight_doc(width: int) -> dict:
    return {
        "pools": [{"name": "wide", "width": width}],
        "models": [{"name": "wide-model", "base_url": "{sim}", "pool": "wide", "timeout_ms": 120000}],
        "workflows": [{"name": "bulk", "priority": "background", "candidates": ["wide-model"]}],
    }


class Run:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.redis = EmbeddedRedis(work / "redis")
        self.base = self.redis.ensure().rsplit("/", 1)[0]
        self.made = 0

    def deploy(self, document: dict, sim: RemoteSim, fleets: list[str], **settings):
        self.made += 1
        url = f"{self.base}/{self.made % 15 + 1}"
        redis.Redis.from_url(url).flushdb()
        return deploy(self.work / f"d{self.made}", url, json.loads(json.dumps(document)), sim, fleets, **settings)

    def close(self) -> None:
        self.redis.stop()


def finish(dep, results, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    for result in results:
        result.get(timeout=max(1.0, deadline - time.monotonic()), propagate=False)
    return [dep.client.result(r.id) for r in results]


def served_at(report: dict) -> float:
    steps = [s for a in report["attempts"] for s in a["steps"] if s["action"] == "served"]
    return steps[-1]["admitted_at"] if steps else float("inf")


def burst(run: Run, pool: str, held: int, size: int) -> dict:
    sim = RemoteSim(BURST_SIM)
    dep = run.deploy(BURST_DOC, sim, ["dialog"], fleet_pool=pool, fleet_held_messages=held)
    try:
        for warm in [dep.client.submit("dialog", CHAT, deadline=60) for _ in range(3)]:
            warm.get(timeout=60, propagate=False)
        sim.reset()
        start = time.time()
        results = [dep.client.submit("dialog", CHAT, deadline=10.0) for _ in range(size)]
        finish(dep, results, 120)
        done = [dep.client.celery.AsyncResult(r.id) for r in results]
        in_deadline = sum(1 for r in done if r.state == "SUCCESS" and r.date_done.timestamp() <= start + 10.0)
        stats = sim.stats()
        return {"in_deadline": in_deadline, "of": size, "primary_max": stats["primary"]["max_in_flight"],
                "hosted_max": stats["hosted-fallback"]["max_in_flight"]}
    finally:
        dep.close()
        sim.stop()


def shares(run: Run, pool: str, held: int, size: int) -> dict:
    sim = RemoteSim(["tool-model:2:1000"])
    dep = run.deploy(SHARES_DOC, sim, ["tools"], fleet_pool=pool, fleet_held_messages=held)
    try:
        big = [dep.client.submit("burst", CHAT) for _ in range(size)]
        time.sleep(2.0)
        small_from = time.time()
        small = [dep.client.submit("small", CHAT) for _ in range(10)]
        reports = finish(dep, small + big, 600)
        ids = {r.id for r in small}
        later = sorted((r for r in reports if served_at(r) >= small_from), key=served_at)
        last = max(i for i, r in enumerate(later) if r["task_id"] in ids)
        ends = sorted(served_at(r) for r in reports if r["task_id"] in ids)
        return {"burst_before_small_done": sum(1 for r in later[:last] if r["task_id"] not in ids),
                "small_last_answer_s": round(ends[-1] - small_from + 1.0, 1),
                "owed_share_ideal_s": round(10 * 1.0 / 1 + 1.0, 1)}
    finally:
        dep.close()
        sim.stop()


def process_cpu_and_rss(pid: int) -> tuple[float, int]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return cpu, rss * 1024


def redis_cpu_and_memory(client: redis.Redis) -> tuple[float, int]:
    info = client.info()
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"]), int(info["used_memory"])


def in_flight(run: Run, pool: str, held: int, capacity: int, *, processes: int = 1,
              service_ms: int = 1000) -> dict:
    sim = RemoteSim([f"wide-model:{capacity}:{service_ms}"])
    dep = run.deploy(flight_doc(capacity), sim, [])
    workers = []
    server = redis.Redis.from_url(dep.redis_url)
    try:
        # The work is queued first, so the workers alone set the pace (not the submitter).
        count = capacity * 3
        results = [dep.client.submit("bulk", CHAT) for _ in range(count)]
        redis_before = redis_counters(server)
        # ``processes`` worker processes of the background queue, each holding
        # ``held`` messages (the threads pool: one thread each; its old cap was 64 a queue).
        for n in range(processes):
            proc = subprocess.Popen([sys.executable, "-m", "workers.main", "--fleet", "wide", "--background",
                                     str(held), "--pool", pool, "--loglevel",
                                     os.environ.get("BENCH_WORKER_LOGLEVEL", "WARNING")], env=dep.env, cwd=ROOT)
            dep.workers["wide" if n == 0 else f"wide-{n}"] = proc
            workers.append(proc.pid)
        # For a profiler to attach to (py-spy record --pid).
        print(f"inflight worker pids {workers}", flush=True)
        return watch(sim, server, redis_before, workers, count, capacity, service_ms,
                     lambda: finish(dep, results, 120))
    finally:
        server.close()
        dep.close()
        sim.stop()


def redis_counters(client: redis.Redis) -> tuple[float, int]:
    """Redis's CPU seconds and the connections it has accepted, so far."""
    return redis_cpu_and_memory(client)[0], int(client.info("stats")["total_connections_received"])


def watch(sim: RemoteSim, server: redis.Redis, redis_before: tuple[float, int], workers: list[int], count: int,
          capacity: int, service_ms: int, finished) -> dict:
    """Sample the simulator until it has served ``count``, then call ``finished`` (every
    result in) and report what was in flight, the workers' CPU and memory, and Redis's
    (``redis_before``: :func:`redis_counters` before the workers started)."""
    cpu0 = sum(process_cpu_and_rss(pid)[0] for pid in workers)
    samples = []
    redis_peak = clients_peak = 0
    deadline = time.monotonic() + 600 + 4 * service_ms / 1000
    while time.monotonic() < deadline:
        stats = sim.stats()["wide-model"]
        samples.append((stats["served"], stats["in_flight"]))
        redis_peak = max(redis_peak, redis_cpu_and_memory(server)[1])
        clients_peak = max(clients_peak, int(server.info("clients")["connected_clients"]))
        if stats["served"] >= count:
            break
        time.sleep(0.25)
    finished()
    ends = [process_cpu_and_rss(pid) for pid in workers]
    redis_cpu, connections = redis_counters(server)
    # Steady state: the middle third of the work (the first and last thirds
    # are the ramp up and the drain of the backlog).
    steady = sorted(flying for served, flying in samples if capacity <= served <= count - capacity) or [0]
    return {"steady_in_flight_median": steady[len(steady) // 2],
            "max_in_flight": max((flying for _, flying in samples), default=0),
            "width": capacity, "requests": count,
            "cpu_s_per_request": round((sum(cpu for cpu, _ in ends) - cpu0) / count, 5),
            "worker_rss_mb": [round(rss / 2**20, 1) for _, rss in ends],
            "redis_cpu_s_per_request": round((redis_cpu - redis_before[0]) / count, 5),
            "redis_peak_memory_mb": round(redis_peak / 2**20, 1),
            # Every client of the bench's Redis (the workers, the simulator's
            # harness, this script): what the workers' pools opened at most.
            "redis_peak_clients": clients_peak,
            "redis_connections_opened": connections - redis_before[1]}


def plain_in_flight(run: Run, held: int, capacity: int, *, service_ms: int = 1000) -> dict:
    """The same work through plain Celery on the gevent pool (bench/plain_worker.py: no lane,
    no routing, a task that calls the simulator): what the machine gives one process of
    Celery alone, the ceiling for any layer on top of it."""
    from lanes.celery_client import make_celery
    from lanes.settings import Settings
    from plain_worker import PLAIN_TASK

    sim = RemoteSim([f"wide-model:{capacity}:{service_ms}"])
    run.made += 1
    url = f"{run.base}/{run.made % 15 + 1}"
    server = redis.Redis.from_url(url)
    server.flushdb()
    state = run.work / f"plain{run.made}"
    app = make_celery(Settings(state_dir=state, redis_url=url), url, main="plain-client", kombu_transport=True)
    proc = None
    try:
        count = capacity * 3
        results = [app.send_task(PLAIN_TASK, args=[sim.base_url, "wide-model", CHAT], queue="plain")
                   for _ in range(count)]
        redis_before = redis_counters(server)
        env = {**os.environ, "LANES_REDIS_URL": url, "LANES_STATE_DIR": str(state)}
        proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "plain_worker.py"), "--concurrency", str(held),
                                 "--queue", "plain", "--pool", "gevent"], env=env, cwd=ROOT)

        def finished() -> None:
            deadline = time.monotonic() + 120
            for result in results:
                result.get(timeout=max(1.0, deadline - time.monotonic()), propagate=False)

        return watch(sim, server, redis_before, [proc.pid], count, capacity, service_ms, finished)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        app.close()
        server.close()
        sim.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--only", nargs="*", default=["burst", "shares", "inflight"])
    parser.add_argument("--capacity", type=int, default=None,
                        help="in flight: the simulator's capacity (default 1000; --smoke 50)")
    parser.add_argument("--pools", nargs="*", default=["gevent", "threads", "plain"],
                        choices=["gevent", "threads", "plain"],
                        help="in flight: the worker pools to run (default all three; plain: plain Celery on "
                             "the gevent pool, no lanes, the machine's ceiling for one process)")
    parser.add_argument("--processes", type=int, default=1,
                        help="in flight: worker processes sharing the queue (default 1)")
    parser.add_argument("--service-ms", type=int, default=1000,
                        help="in flight: the backend's time per request (default 1000)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        run = Run(Path(work))
        try:
            if "burst" in args.only:
                size = 12 if args.smoke else 40
                for pool, held in (("gevent", 2000), ("threads", 4)):
                    print(f"burst {pool:7s} held {held:5d}: {burst(run, pool, held, size)}", flush=True)
            if "shares" in args.only and not args.smoke:
                for pool, held in (("gevent", 2000), ("threads", 4)):
                    print(f"shares {pool:7s} held {held:5d}: {shares(run, pool, held, 60)}", flush=True)
            if "inflight" in args.only:
                capacity = args.capacity or (50 if args.smoke else 1000)
                for pool, held in (("gevent", max(2000, capacity)), ("threads", 64)):
                    if pool not in args.pools:
                        continue
                    if args.processes > 1:
                        held = -(-3 * capacity // (2 * args.processes))  # together: the width in flight, half as many waiting
                    print(f"inflight {pool:7s} held {held:5d} x {args.processes} capacity {capacity} "
                          f"service {args.service_ms} ms: "
                          f"{in_flight(run, pool, held, capacity, processes=args.processes, service_ms=args.service_ms)}",
                          flush=True)
                if "plain" in args.pools and args.processes == 1:
                    held = max(2000, capacity)
                    print(f"inflight plain   held {held:5d} x 1 capacity {capacity} service {args.service_ms} ms: "
                          f"{plain_in_flight(run, held, capacity, service_ms=args.service_ms)}", flush=True)
        finally:
            run.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

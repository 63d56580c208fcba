"""Soak: a long mixed load with workers killed at random and a capacity change
midway; nothing lost, widths held, memory flat. Its full run takes tens of
minutes; `dev.py bench` runs 10 of them and CI's smoke pass one:

    python bench/soak.py                  # 30 minutes
    python bench/soak.py --minutes 10     # shorter
    python bench/soak.py --smoke          # 1 minute, a kill every 20 s

The fleet: two pools (dialog, width 4, the `overload` controller on, its backend
answering 529 when full; utility, width 3) served by `lanes sim` in a process of
its own, each pool's fleet worker supervised, the durable embedded Redis.
Every few minutes one worker process is SIGKILLed (its supervisor restarts it);
halfway through, the dialog backend's capacity drops from 6 to 3.

Printed at the end: tasks submitted / answered / failed (by reason) / lost (must be
0), the highest concurrency each backend saw against its pool's widest width,
interactive submit-to-answer p50 / p99, Redis and worker memory (RSS) at start and
end and their ratio (flat: close to 1).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from lanes.embedded import EmbeddedRedis  # noqa: E402
from tests.e2e.harness import RemoteSim, deploy  # noqa: E402

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
DOC = {
    "pools": [
        {"name": "dialog", "width": 4, "ceiling": 6, "controller": {"kind": "overload"}},
        {"name": "utility", "width": 3},
    ],
    "models": [
        {"name": "chat", "base_url": "{sim}", "pool": "dialog", "timeout_ms": 20_000},
        {"name": "tool", "base_url": "{sim}", "pool": "utility", "timeout_ms": 20_000},
    ],
    "workflows": [
        {"name": "dialog", "priority": "interactive", "candidates": ["chat", "tool"], "reserve_ms": 5_000},
        {"name": "assist", "priority": "user_tool", "candidates": ["tool"]},
        {"name": "notes", "priority": "background", "candidates": ["chat"]},
        {"name": "digest", "priority": "background", "candidates": ["tool"]},
    ],
}


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def worker_pids(dep) -> list[int]:
    pids = []
    for proc in dep.workers.values():
        found = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        pids += [int(p) for p in found]
    return pids


def memory(dep, server: EmbeddedRedis) -> dict:
    return {"redis_kib": rss_kib(server.pid() or 0), "workers_kib": sum(rss_kib(p) for p in worker_pids(dep))}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=4.0, help="submits per second")
    parser.add_argument("--kill-every", type=float, default=120.0, help="seconds between worker kills")
    parser.add_argument("--smoke", action="store_true", help="a quick pass: 1 minute, a kill every 20 s")
    args = parser.parse_args(argv)
    if args.smoke:
        args.minutes, args.kill_every = 1.0, 20.0

    folder = Path(tempfile.mkdtemp(prefix="lanes-soak-"))
    server = EmbeddedRedis(folder / "redis")
    url = server.ensure()
    sim = RemoteSim(["chat:6:400", "tool:16:300"], extra_args=("--overflow", "gateway"))
    try:
        dep = deploy(folder / "state", url, json.loads(json.dumps(DOC)), sim, ["dialog", "utility"],
                     lease_seconds=10.0, visibility_timeout_seconds=120)
    except BaseException:
        sim.stop()
        server.stop()
        raise
    rng = random.Random(33)
    accepted: list[tuple[str, str, float]] = []
    stop = threading.Event()
    time.sleep(10)
    start_memory = memory(dep, server)

    def load() -> None:
        kinds = ["dialog"] * 3 + ["assist"] * 2 + ["notes"] * 3 + ["digest"] * 2
        while not stop.is_set():
            workflow = rng.choice(kinds)
            deadline = 120 if workflow in ("dialog", "assist") else None
            try:
                task = dep.client.submit(workflow, CHAT, deadline=deadline)
                accepted.append((workflow, task.id, time.time()))
            except Exception as exc:  # refused: nothing acknowledged
                print(f"submit refused: {exc}", flush=True)
            stop.wait(rng.expovariate(args.rate))

    sender = threading.Thread(target=load, daemon=True)
    sender.start()
    began = time.monotonic()
    total = args.minutes * 60
    next_kill = began + args.kill_every
    changed = killed = 0
    while time.monotonic() - began < total:
        time.sleep(1.0)
        now = time.monotonic()
        if not changed and now - began > total / 2:
            sim.configure("chat", capacity=3)
            changed = 1
            print(f"{now - began:.0f}s: dialog backend capacity 6 -> 3", flush=True)
        if now >= next_kill:
            pids = worker_pids(dep)
            if pids:
                os.kill(rng.choice(pids), signal.SIGKILL)
                killed += 1
                print(f"{now - began:.0f}s: killed a worker process ({killed})", flush=True)
            next_kill = now + args.kill_every
    stop.set()
    sender.join()
    end_memory = memory(dep, server)

    states: dict[str, dict] = {}
    give_up = time.monotonic() + 600
    while time.monotonic() < give_up and len(states) < len(accepted):
        for _, task_id, _ in accepted:
            if task_id not in states:
                report = dep.client.wait(task_id, 0.01)
                if report is not None:
                    states[task_id] = report
        time.sleep(1.0)
    meta = redis.Redis.from_url(url)
    interactive = []
    for workflow, task_id, sent in accepted:
        if workflow == "dialog" and states.get(task_id, {}).get("state") == "SUCCESS":
            raw = meta.get(f"celery-task-meta-{task_id}")
            done = json.loads(raw)["date_done"] if raw else None
            if done:
                from datetime import datetime
                interactive.append(datetime.fromisoformat(done).timestamp() - sent)
    stats = sim.stats()
    widest = {"dialog": 6, "utility": 3}
    report = {
        "minutes": args.minutes,
        "submitted": len(accepted),
        "answered": sum(1 for r in states.values() if r["state"] == "SUCCESS"),
        "failed": dict(Counter(r["error"]["type"] for r in states.values() if r["state"] != "SUCCESS")),
        "lost": sum(1 for _, t, _ in accepted if t not in states),
        "worker_kills": killed,
        "peak_in_flight": {"chat": stats["chat"]["max_in_flight"], "tool": stats["tool"]["max_in_flight"]},
        "widest_width": {"chat": widest["dialog"], "tool": widest["utility"]},
        "interactive_p50_s": percentile(interactive, 0.50),
        "interactive_p99_s": percentile(interactive, 0.99),
        "memory_start_kib": start_memory,
        "memory_end_kib": end_memory,
        "redis_memory_ratio": round(end_memory["redis_kib"] / max(1, start_memory["redis_kib"]), 3),
        "worker_memory_ratio": round(end_memory["workers_kib"] / max(1, start_memory["workers_kib"]), 3),
    }
    print("soak:", json.dumps(report, sort_keys=True), flush=True)
    dep.close()
    sim.stop()
    server.stop()
    return 1 if report["lost"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

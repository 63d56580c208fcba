"""The routing benchmark's background scenarios (issue 18).

5. background backlog: a backlog queued whole before timing (the simulator
   holds every call at capacity 0 while it is submitted, then is raised to
   W), drained by the fleet; tasks/s against the backend's ideal (W / service
   time) and against plain Celery with W workers on the same backlog. Two
   kinds of background work at 50 ms and 200 ms service: a natively background
   workflow (``bg``, like ``memory_extraction``) and an interactive workflow
   the caller lowered to background (``inter`` at priority background, like
   ``dialog``), and the background workflow again right after a burst of
   user-tool work. Target >= 0.95 of the ideal, no over-admission.
6. mixed load: the same background backlog at 200 ms service, and bursts of
   1..W interactive requests arriving during it. The simulator's running
   count sampled every 10 ms / W (target >= 0.95); interactive admission
   times; how many background tasks were admitted while an interactive
   request waited in the lane (must be 0) or waited for a worker thread
   (the Celery layer keeping urgent work from the lane).
"""

from __future__ import annotations

import random
import statistics
import threading
import time

import httpx
from routing_setup import CHAT, W, Bench, p, settle, wait_ready
from tests.e2e.harness import RemoteSim

# name -> (workflow, priority the caller asks for; None: the workflow's own)
BACKGROUND_KINDS = {
    "memory_extraction": ("bg", None),
    "dialog_lowered": ("inter", "background"),
}


class RunningSampler:
    """The simulator's running count, sampled every 10 ms on a thread of its own."""

    def __init__(self, sim: RemoteSim) -> None:
        self.samples: list[tuple[float, int, int]] = []  # (time, running, served)
        self._url = sim.url + "/admin/stats"  # a client of its own: httpx clients are not shared across threads
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=10) as http:
            while not self._stop.is_set():
                stats = http.get(self._url).json()["m"]
                self.samples.append((time.monotonic(), stats["running"], stats["served"]))
                time.sleep(0.01)

    def stop(self) -> list[tuple[float, int, int]]:
        self._stop.set()
        self._thread.join(10)
        return self.samples


def held_backlog(sim: RemoteSim, submit, n: int) -> list:
    """Submit ``n`` tasks while the simulator holds every call, so the whole
    backlog is queued (W calls held, the rest in the lane and Celery) before timing."""
    sim.configure("m", capacity=0)
    sim.reset()
    results = [submit() for _ in range(n)]
    settle(sim, lambda s: s["in_flight"] == min(n, W), timeout=60)
    return results


def drain(sim: RemoteSim, submit, n: int, service_ms: int) -> dict:
    ideal = W / (service_ms / 1000)
    results = held_backlog(sim, submit, n)
    start = time.monotonic()
    sim.configure("m", capacity=W)
    sampler = RunningSampler(sim)
    # A drain that stops (the backend idle, the backlog still queued) is a
    # figure too: give up after 20 x the ideal time and report what was served.
    settle(sim, lambda s: s["served"] >= n, timeout=30 + 20 * n / ideal)
    elapsed = time.monotonic() - start
    samples = sampler.stop()
    served = sim.stats()["m"]["served"]
    if served >= n:
        wait_ready(results)
    for r in results:
        r.forget()
    # Running count while work was still queued (the last W calls drain alone).
    busy = [running for _, running, done in samples if done <= n - W]
    rate = served / elapsed
    return {
        "tasks_per_s": round(rate, 1),
        "share_of_ideal": round(rate / ideal, 3),
        "mean_running": round(statistics.fmean(busy), 3) if busy else None,
        "max_in_flight": sim.stats()["m"]["max_in_flight"],
        "served": served,
        **({} if served >= n else {"stalled_with_queued": n - served}),
    }


def background_backlog(bench: Bench, sizes: dict[int, int]) -> dict:
    """``sizes``: service time in ms -> backlog size."""
    out: dict = {"width": W, "backend_capacity": W, "target": ">= 0.95 of ideal, max_in_flight <= width"}
    for service_ms, n in sizes.items():
        row: dict = {"tasks": n, "ideal_tasks_per_s": round(W / (service_ms / 1000), 1)}
        sim = RemoteSim([f"m:{W}:{service_ms}"])
        try:
            dep = bench.deploy(sim, W)
            try:
                for kind, (workflow, priority) in BACKGROUND_KINDS.items():
                    row[kind] = drain(sim, lambda: dep.client.submit(workflow, CHAT, priority=priority), n, service_ms)
                # After urgent traffic: a user-tool burst runs to completion first.
                burst = [dep.client.submit("tool", CHAT) for _ in range(n)]
                wait_ready(burst)
                for r in burst:
                    r.forget()
                row["memory_extraction_after_burst"] = drain(
                    sim, lambda: dep.client.submit("bg", CHAT), n, service_ms)
            finally:
                dep.close()
            plain = bench.plain(sim, W, queue="plain-background")
            try:
                row["plain_celery"] = drain(sim, lambda: plain.submit(sim), n, service_ms)
            finally:
                plain.close()
        finally:
            sim.stop()
        for kind in (*BACKGROUND_KINDS, "memory_extraction_after_burst"):
            row[kind]["vs_plain"] = round(row[kind]["tasks_per_s"] / row["plain_celery"]["tasks_per_s"], 3)
        out[f"service_{service_ms}ms"] = row
    return out


def mixed_load(bench: Bench, bursts: int, seconds_hint: float) -> dict:
    service_ms = 200
    backlog = int((seconds_hint + 10) * W / (service_ms / 1000) * 1.3)
    sim = RemoteSim([f"m:{W}:{service_ms}"])
    out: dict = {"width": W, "service_ms": service_ms, "bursts": bursts, "background_backlog": backlog,
                 "target": "utilisation >= 0.95; 0 background admitted while interactive waited in the lane"}
    try:
        dep = bench.deploy(sim, W)
        try:
            background = held_backlog(sim, lambda: dep.client.submit("bg", CHAT), backlog)
            sim.configure("m", capacity=W)
            time.sleep(1.0)  # past the start: the lane full, waiters parked
            sampler = RunningSampler(sim)
            rng = random.Random(7)
            interactive = []
            for index in range(bursts):
                time.sleep(rng.uniform(0.1, 0.3))
                size = index % W + 1  # 1..W requests at once
                sent = time.time()
                batch = [dep.client.submit("inter", CHAT, deadline=120) for _ in range(size)]
                wait_ready(batch, poll=0.002)
                interactive += [(sent, r.result["trace"]) for r in batch]
            samples = sampler.stop()
            out.update(_admission_report(interactive, background))
            stats = sim.stats()["m"]
        finally:
            dep.close()
    finally:
        sim.stop()
    running = [r for _, r, _ in samples]
    out["utilisation"] = round(statistics.fmean(running) / W, 3)
    out["samples"] = len(running)
    out["max_in_flight"] = stats["max_in_flight"]
    return out


def _admission_report(interactive: list[tuple[float, dict]], background: list) -> dict:
    """Where each interactive request spent its time, and which background
    tasks got a slot meanwhile: while it waited for a worker thread (sent ->
    its walk starts), on its way to the lane (walk start -> lane entry, a few
    Redis reads), or in the lane (lane entry -> admitted: must be none)."""
    bg_admitted = []
    for r in background:
        if r.ready() and r.successful():
            bg_admitted.append(r.result["trace"]["steps"][-1]["admitted_at"])
        r.forget()
    admission, delivery = [], []
    awaiting_thread = on_the_way = in_lane = 0
    for sent, trace in interactive:
        step = trace["steps"][-1]
        admitted, walk_start = step["admitted_at"], trace["started_at"]
        entered_lane = admitted - step["wait_ms"] / 1000
        admission.append(admitted - sent)
        delivery.append(walk_start - sent)
        awaiting_thread += sum(1 for b in bg_admitted if sent < b <= walk_start)
        on_the_way += sum(1 for b in bg_admitted if walk_start < b <= entered_lane)
        in_lane += sum(1 for b in bg_admitted if entered_lane < b < admitted)
    return {
        "interactive_requests": len(interactive),
        "admission_p50_ms": round(p(admission, 50) * 1000, 1),
        "admission_p99_ms": round(p(admission, 99) * 1000, 1),
        "sent_to_walk_start_p99_ms": round(p(delivery, 99) * 1000, 1),
        "background_admitted_while_interactive_awaited_a_thread": awaiting_thread,
        "background_admitted_while_interactive_walked_to_the_lane": on_the_way,
        "background_admitted_while_interactive_waited_in_the_lane": in_lane,
    }

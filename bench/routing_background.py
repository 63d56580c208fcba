"""The routing benchmark's background scenarios (issue 18).

5. background backlog: a backlog queued whole before timing (the simulator
   holds every call at capacity 0 while it is submitted, then is raised to
   its capacity), drained by the fleet; tasks/s against the backend's ideal
   (capacity / service time) and against plain Celery on the same backlog
   with as many threads as the fleet runs for its background queue (like
   with like: the fleet's extra waiting threads are not counted as routing). Two kinds of background work at 50 ms and
   200 ms service: a natively background workflow (``bg``, like
   ``memory_extraction``) and an interactive workflow the caller lowered to
   background (``inter`` at priority background, like ``dialog``), and the
   background workflow again right after a burst of user-tool work. Two
   setups: the example fleet's (a lane of width 6 over a backend of capacity
   4 in queue mode, as the issue measured it), where the backend always has a
   call queued and only a slot left empty can cost throughput; and a lane at
   exactly the backend's capacity (4 over 4), where every gap between one
   call's answer and the next call reaching the backend is idle backend time,
   so the stand-in's own per-call overhead counts too: the back-to-back row
   (``capacity`` threads calling the simulator in a loop, no Celery, no lane)
   measures that ceiling. Target >= 0.95 of the ideal, no over-admission.
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
from routing_setup import CHAT, W, Bench, fleet_threads, p, settle, wait_ready

from lanes.catalog import ModelInfo
from lanes.routing.backend import BackendClient
from tests.e2e.harness import RemoteSim

# setup -> (lane width, backend capacity)
SETUPS = {
    "example_fleet_width_6_over_capacity_4": (6, W),
    "width_4_at_capacity_4": (W, W),
}

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


def held_backlog(sim: RemoteSim, submit, n: int, width: int = W) -> list:
    """Submit ``n`` tasks while the simulator holds every call, so the whole
    backlog is queued (``width`` calls held, the rest in the lane and Celery) before timing."""
    sim.configure("m", capacity=0)
    sim.reset()
    results = [submit() for _ in range(n)]
    settle(sim, lambda s: s["in_flight"] == min(n, width), timeout=60)
    return results


def drain(sim: RemoteSim, submit, n: int, service_ms: int, width: int = W, capacity: int = W) -> dict:
    ideal = capacity / (service_ms / 1000)
    results = held_backlog(sim, submit, n, width)
    start = time.monotonic()
    sim.configure("m", capacity=capacity)
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
    # Running count while work was still queued (the last calls drain alone).
    busy = [running for _, running, done in samples if done <= n - width]
    rate = served / elapsed
    return {
        "tasks_per_s": round(rate, 1),
        "share_of_ideal": round(rate / ideal, 3),
        "mean_running": round(statistics.fmean(busy), 3) if busy else None,
        "max_in_flight": sim.stats()["m"]["max_in_flight"],
        "over_admitted": sim.stats()["m"]["max_in_flight"] > width,
        "served": served,
        **({} if served >= n else {"stalled_with_queued": n - served}),
    }


def back_to_back(sim: RemoteSim, n: int, service_ms: int, capacity: int) -> dict:
    """The stand-in's own ceiling: ``capacity`` threads calling it in a loop (no Celery, no lane)."""
    info = ModelInfo(name="m", base_url=sim.base_url, kind="chat", pool=None, service=None,
                     timeout_seconds=120.0, api_key_env=None)
    left = [n]
    lock = threading.Lock()

    def caller() -> None:
        backend = BackendClient()
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            backend.call(info, CHAT, timeout=120.0)

    sim.reset()
    start = time.monotonic()
    threads = [threading.Thread(target=caller) for _ in range(capacity)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = n / (time.monotonic() - start)
    return {"tasks_per_s": round(rate, 1), "share_of_ideal": round(rate / (capacity / (service_ms / 1000)), 3)}


def background_backlog(bench: Bench, sizes: dict[int, int]) -> dict:
    """``sizes``: service time in ms -> backlog size; every setup of SETUPS at each."""
    out: dict = {"setups": {k: {"width": w, "backend_capacity": c} for k, (w, c) in SETUPS.items()},
                 "target": ">= 0.95 of ideal, max_in_flight <= width"}
    for setup, (width, capacity) in SETUPS.items():
        for service_ms, n in sizes.items():
            out[f"{setup}_service_{service_ms}ms"] = _backlog_row(bench, width, capacity, service_ms, n)
    return out


def _backlog_row(bench: Bench, width: int, capacity: int, service_ms: int, n: int) -> dict:
    row: dict = {"tasks": n, "ideal_tasks_per_s": round(capacity / (service_ms / 1000), 1)}
    sim = RemoteSim([f"m:{capacity}:{service_ms}"])
    try:
        dep = bench.deploy(sim, width)
        threads = fleet_threads(dep, background=True)
        row["fleet_background_threads"] = threads
        try:
            for kind, (workflow, priority) in BACKGROUND_KINDS.items():
                row[kind] = drain(sim, lambda: dep.client.submit(workflow, CHAT, priority=priority),
                                  n, service_ms, width, capacity)
            # After urgent traffic: a user-tool burst runs to completion first.
            burst = [dep.client.submit("tool", CHAT) for _ in range(n)]
            wait_ready(burst)
            for r in burst:
                r.forget()
            row["memory_extraction_after_burst"] = drain(
                sim, lambda: dep.client.submit("bg", CHAT), n, service_ms, width, capacity)
        finally:
            dep.close()
        plain = bench.plain(sim, threads, queue="plain-background")
        try:
            # Its "width" is its thread count: that many calls in flight is its normal, not over-admission.
            row["plain_celery"] = drain(sim, lambda: plain.submit(sim), n, service_ms, threads, capacity)
        finally:
            plain.close()
        row["back_to_back_client"] = back_to_back(sim, n, service_ms, capacity)
    finally:
        sim.stop()
    for kind in (*BACKGROUND_KINDS, "memory_extraction_after_burst"):
        row[kind]["vs_plain"] = round(row[kind]["tasks_per_s"] / row["plain_celery"]["tasks_per_s"], 3)
        row[kind]["vs_back_to_back"] = round(row[kind]["tasks_per_s"] / row["back_to_back_client"]["tasks_per_s"], 3)
    return row


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

"""A deterministic discrete-event harness for the control laws (no sleeping, no I/O).

One lane in front of a backend with a hidden capacity split over replicas:

- requests wait in the lane (an endless backlog, or Poisson arrivals) and
  are admitted while the lane has a free slot, each stamped with the
  controller generation in force;
- a replica runs at most its share of the capacity; beyond it a request
  waits in the replica's queue (``mode="gauges"``, as vLLM does) or is
  answered 529 at once (``mode="overload"``, a hosted API);
- service times are lognormal around a mean (seeded, so every run is the same);
- vLLM-like gauges (running, waiting for capacity, KV usage) are sampled as
  they were ``lag`` seconds before each scrape;
- the capacity can change at given times.

Every ``interval`` the law under test sees the same :class:`Signals` the
live loop builds, and its width is applied at once (a shrink revokes no one).
The run records each interval's width and, between decisions, the time the
lane held more requests than the capacity (over-admission) and the capacity
left unused while work waited (idle slots).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from lanes.control.laws import Bounds, Gauges, Signals

Decide = Callable[[Signals, Bounds, dict], int]


@dataclass(frozen=True)
class Scenario:
    name: str
    capacity: tuple[tuple[float, int], ...]  # (from time, capacity), first at 0
    start_width: int
    mode: str = "overload"  # or "gauges"
    floor: int = 1
    ceiling: int = 512
    replicas: int = 2
    service_s: float = 1.0
    sigma: float = 0.3
    interval_s: float = 5.0
    lag_s: float = 1.0
    reject_s: float = 0.05  # how long a 529 takes to come back
    cycles: int = 40
    arrival_rate: float | None = None  # None: an endless backlog
    background_share: float = 0.0  # share of requests that are background work
    seed: int = 7

    def capacity_at(self, t: float) -> int:
        current = self.capacity[0][1]
        for start, value in self.capacity:
            if t >= start:
                current = value
        return current


@dataclass
class Run:
    scenario: Scenario
    widths: list[int] = field(default_factory=list)  # width after each decision
    capacities: list[int] = field(default_factory=list)  # capacity at each decision
    changes: int = 0
    cuts: int = 0
    over_admitted_s: float = 0.0
    idle_slot_s: float = 0.0
    capacity_s: float = 0.0
    served: int = 0
    rejected: int = 0
    peak_running_over: int = 0  # the most the backend ran above its capacity

    @property
    def over_admission(self) -> float:
        """Share of the run's time the lane held more requests than the backend could run."""
        return self.over_admitted_s / (self.scenario.cycles * self.scenario.interval_s)

    @property
    def idle_slots(self) -> float:
        """Share of the backend's capacity left unused while work waited in the lane."""
        return self.idle_slot_s / self.capacity_s if self.capacity_s else 0.0

    def cycles_to_settle(self, since_cycle: int = 0, tolerance: float = 0.10) -> int | None:
        """Decisions after ``since_cycle`` until the width is, and stays, within tolerance of the
        capacity (until the capacity changes again); None if it never settles."""
        settled = None
        end = len(self.widths)
        for i in range(since_cycle + 1, len(self.widths)):
            if self.capacities[i] != self.capacities[since_cycle]:
                end = i
                break
        for i in range(since_cycle, end):
            target = self.capacities[i]
            inside = abs(self.widths[i] - target) <= tolerance * target
            if inside and settled is None:
                settled = i
            elif not inside:
                settled = None
        return None if settled is None else settled - since_cycle + 1

    def range_after(self, cycle: int) -> tuple[int, int]:
        tail = self.widths[cycle:]
        return (min(tail), max(tail)) if tail else (0, 0)


class _Replica:
    __slots__ = ("capacity", "running", "queue")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.running = 0
        self.queue: list[tuple[int, int, bool]] = []  # (request id, generation, background)


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def simulate(scenario: Scenario, decide: Decide) -> Run:
    sc = scenario
    rng = random.Random(sc.seed)
    mu = math.log(sc.service_s) - sc.sigma ** 2 / 2
    run = Run(sc)
    bounds = Bounds(sc.floor, sc.ceiling)
    memo: dict = {}
    replicas = [_Replica(c) for c in split(sc.capacity_at(0.0), sc.replicas)]
    events: list = []
    seq = 0

    def push(t: float, kind: str, data=None) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, data))

    width = sc.start_width
    generation = 0
    in_flight = 0
    waiting = 0 if sc.arrival_rate is not None else 10 ** 9
    admitted = overloads = completions = 0
    overload_in_flight: int | None = None
    served_seconds = 0.0
    history: deque = deque()  # (t, (running, waiting, kv)), oldest first, pruned as scrapes pass it
    last_t = 0.0
    next_id = 0

    def gauges_now() -> tuple[float, float, float]:
        running = sum(r.running for r in replicas)
        queued = sum(len(r.queue) for r in replicas)
        kv = sum(min(1.0, r.running / r.capacity) if r.capacity else 1.0 for r in replicas) / len(replicas)
        return running, queued, kv

    def account(now: float) -> None:
        nonlocal last_t
        dt = now - last_t
        if dt > 0:
            cap = sc.capacity_at(last_t)
            if in_flight > cap:
                run.over_admitted_s += dt
            running = sum(r.running for r in replicas)
            if waiting > 0 or in_flight > running:
                run.idle_slot_s += max(0, cap - running) * dt
            run.capacity_s += cap * dt
        last_t = now

    def start(now: float, replica: _Replica, rid: int, gen: int) -> None:
        replica.running += 1
        run.peak_running_over = max(run.peak_running_over, replica.running - replica.capacity)
        push(now + rng.lognormvariate(mu, sc.sigma), "done", (replica, rid, gen, now))

    def admit(now: float) -> None:
        nonlocal in_flight, waiting, admitted, next_id
        while in_flight < width and waiting > 0:
            waiting -= 1
            in_flight += 1
            admitted += 1
            next_id += 1
            background = rng.random() < sc.background_share
            replica = max(replicas, key=lambda r: (r.capacity - r.running, -len(r.queue)))
            if replica.running < replica.capacity:
                start(now, replica, next_id, generation)
            elif sc.mode == "overload":
                push(now + sc.reject_s, "reject", (generation, background))
            else:
                min(replicas, key=lambda r: len(r.queue)).queue.append((next_id, generation, background))
        history.append((now, gauges_now()))

    def release(now: float) -> None:
        nonlocal in_flight
        in_flight -= 1
        admit(now)

    def lagged_gauges(now: float) -> Gauges:
        while len(history) > 1 and history[1][0] <= now - sc.lag_s:
            history.popleft()
        running, queued, kv = history[0][1] if history else (0.0, 0.0, 0.0)
        return Gauges(ok=True, running=running, waiting=queued, waiting_capacity=queued, kv_usage=kv)

    push(0.0, "tick0")
    if sc.arrival_rate is not None:
        push(rng.expovariate(sc.arrival_rate), "arrive")
    for start_t, _ in sc.capacity[1:]:
        push(start_t, "capacity")
    end = sc.cycles * sc.interval_s
    last_decision = 0.0
    while events:
        now, _, kind, data = heapq.heappop(events)
        if now > end:
            break
        account(now)
        if kind == "tick0":
            admit(now)
            push(sc.interval_s, "tick")
        elif kind == "arrive":
            waiting += 1
            admit(now)
            push(now + rng.expovariate(sc.arrival_rate), "arrive")
        elif kind == "done":
            replica, _rid, _gen, started = data
            replica.running -= 1
            run.served += 1
            completions += 1
            served_seconds += now - started
            if replica.queue and replica.running < replica.capacity:
                rid, gen, _bg = replica.queue.pop(0)
                start(now, replica, rid, gen)
            release(now)
        elif kind == "reject":
            gen, background = data
            run.rejected += 1
            release(now)
            if not background and gen == generation:
                overloads += 1
                if overload_in_flight is None:
                    overload_in_flight = in_flight
        elif kind == "capacity":
            for replica, share in zip(replicas, split(sc.capacity_at(now), sc.replicas)):
                replica.capacity = share
                while replica.queue and replica.running < replica.capacity:
                    rid, gen, _bg = replica.queue.pop(0)
                    start(now, replica, rid, gen)
            admit(now)
        elif kind == "tick":
            elapsed = now - last_decision
            signals = Signals(
                width=width, in_flight=in_flight, waiting=waiting, admitted=admitted, overloads=overloads,
                overload_in_flight=overload_in_flight, completions=completions,
                served_concurrency=served_seconds / elapsed if elapsed > 0 else None,
                window_seconds=elapsed if elapsed > 0 else None,
                gauges=lagged_gauges(now),
            )
            new = bounds.clamp(decide(signals, bounds, memo))
            completions, served_seconds, last_decision = 0, 0.0, now
            if new != width:
                run.changes += 1
                run.cuts += new < width
                width = new
                generation += 1
                admitted = overloads = 0
                overload_in_flight = None
                admit(now)
            run.widths.append(width)
            run.capacities.append(sc.capacity_at(now))
            push(now + sc.interval_s, "tick")
    return run

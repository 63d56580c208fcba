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

from lanes.control import histograms
from lanes.control.laws import Bounds, Gauges, Signals, wants_reading

Decide = Callable[[Signals, Bounds, dict], int]


@dataclass(frozen=True)
class Outcome:
    """One request's end, as a per-request limiter (Netflix's AIMD, Gradient2) sees it."""

    rejected: bool  # answered 529
    waited: bool  # waited in vLLM's queue before it ran
    rtt: float  # seconds from admission to its answer
    in_flight: int  # the lane's in-flight count before this request left
    width: int


PerRequest = Callable[[Outcome, Bounds, dict], int]

# Inter-token latency histogram bounds (seconds), as vLLM's.
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, math.inf)


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
    # The field's conditions (defaults: the kind world of the first benchmark):
    scrape_s: float | None = None  # least time between two scrapes (None: a fresh one every decision)
    lag_range: tuple[float, float] | None = None  # each scrape's lag drawn in this range (None: lag_s)
    scrape_fail: float = 0.0  # share of scrapes that time out
    # KV usage at a full batch of the largest capacity (0.5: max_num_seqs binds before the cache).
    # KV is token accounting: running x each request's share of the cache. The largest capacity
    # of the schedule is max_num_seqs; a lower one is the cache binding (longer contexts: the
    # share grows until the cache is full at that capacity).
    kv_at_full: float = 1.0
    replica_view: str = "all"  # "all": endpoints listed apart; "one": a balancer answers from one replica
    # Decode steps slow as the batch grows: a request's inter-token latency is
    # itl_s x (1 + itl_slope x the replica's batch when it starts), its service time that x tokens.
    itl_slope: float = 0.0
    itl_s: float = 0.01
    gauge_noise: float = 0.0  # relative noise (sd) on each gauge reading
    # A hosted API (tens of thousands at once, no engine to model): the benchmark keeps it on this
    # harness; every other scenario also runs in front of the simulator's engines.
    hosted: bool = False

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
    admitted: int = 0
    waited: int = 0  # requests that waited in a replica's queue (vLLM's waiting)
    # Of those, the ones that waited for a slot or the KV cache (or were preempted), not only for
    # a step's token budget: the physical engines' harnesses count them (0 in this one).
    waited_for_room: int = 0
    itl_late: list = field(default_factory=list)  # exact inter-token latencies over the run's second half
    itl_buckets: list | None = None  # or their histogram, as an engine counts them (cumulative)

    @property
    def itl_p95(self) -> float | None:
        if self.itl_buckets is not None:
            return histograms.quantile(self.itl_buckets, 0.95)
        if not self.itl_late:
            return None
        ordered = sorted(self.itl_late)
        return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]

    @property
    def over_requests(self) -> float:
        """Share of admitted requests that waited in vLLM's queue or were answered 529."""
        return (self.waited + self.rejected) / self.admitted if self.admitted else 0.0

    @property
    def over_room(self) -> float:
        """Share of admitted requests that waited for a slot or KV room, or were answered 529: over
        the width the backend can run, as no width at or below it would have made them wait."""
        return (self.waited_for_room + self.rejected) / self.admitted if self.admitted else 0.0

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

    def account(self, dt: float, capacity: int, in_flight: int, running: int, waiting: int) -> None:
        """``dt`` seconds of a lane holding ``in_flight`` (``waiting`` more behind it) in front of
        a backend that can run ``capacity`` and runs ``running``."""
        if dt <= 0:
            return
        if in_flight > capacity:
            self.over_admitted_s += dt
        if waiting > 0 or in_flight > running:
            self.idle_slot_s += max(0, capacity - running) * dt
        self.capacity_s += capacity * dt

    def range_after(self, cycle: int) -> tuple[int, int]:
        tail = self.widths[cycle:]
        return (min(tail), max(tail)) if tail else (0, 0)


class _Replica:
    __slots__ = ("capacity", "running", "queue", "itl")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.running = 0
        self.queue: list[tuple[int, int, bool, float]] = []  # (request id, generation, background, admitted at)
        self.itl = [0.0] * len(ITL_BUCKETS)  # cumulative inter-token observations per bucket


class Scrapes:
    """The field's scrapes, as the control loop takes them: at most every ``scrape_s`` (but at
    every decision while a law waits for a reading), some timing out, each ``lag`` old, one
    replica at random behind a balancer, noisy gauges. Its own random draws, apart from the
    workload's, so scrapes never shift service times or arrivals."""

    def __init__(self, sc: Scenario, memo: dict) -> None:
        self.sc, self.memo = sc, memo
        self.rng = random.Random(sc.seed + 1)
        self.last: float | None = None
        self._itl: tuple[list, float] | None = None  # the last reading's histograms, and when

    @property
    def longest_lag(self) -> float:
        return self.sc.lag_range[1] if self.sc.lag_range else self.sc.lag_s

    def lag(self, now: float) -> float | Gauges | None:
        """How old a scrape at ``now`` reads; None: no scrape this decision (throttled, none
        waited for); a failed reading when it times out."""
        sc = self.sc
        if (sc.scrape_s is not None and self.last is not None and now - self.last < sc.scrape_s - 1e-9
                and not wants_reading(self.memo)):
            return None
        self.last = now
        if sc.scrape_fail and self.rng.random() < sc.scrape_fail:
            return Gauges(ok=False, error="timed out")
        return self.rng.uniform(*sc.lag_range) if sc.lag_range else sc.lag_s

    def _latency(self, itl: list | None, now: float) -> tuple[dict, float]:
        """Each endpoint's inter-token histogram growth since the last reading."""
        if itl is None:
            return {}, 0.0
        before, self._itl = self._itl, (itl, now)
        if before is None:
            return {}, 0.0
        grown = [(f"replica {i}", [(le, c - b) for (le, c), (_, b) in zip(cur, old)])
                 for i, (cur, old) in enumerate(zip(itl, before[0]))]
        return {"inter_token": grown}, now - before[1]

    def reading(self, now: float, seen: list, itl: list | None = None) -> Gauges:
        """The reading of ``seen``, each endpoint's (running, waiting for capacity, KV usage),
        and of ``itl``, each endpoint's cumulative inter-token histogram ([(bound, count)])."""
        sc = self.sc
        latency, window = self._latency(itl, now)
        if sc.replica_view == "one":
            seen = [seen[self.rng.randrange(len(seen))]]
        running = sum(r[0] for r in seen)
        queued = sum(r[1] for r in seen)
        kv = sum(r[2] for r in seen) / len(seen)
        if sc.gauge_noise:
            running = max(0, round(running * (1 + self.rng.gauss(0, sc.gauge_noise))))
            queued = max(0, round(queued * (1 + self.rng.gauss(0, sc.gauge_noise))))
            kv = min(1.0, max(0.0, kv * (1 + self.rng.gauss(0, sc.gauge_noise))))
        return Gauges(ok=True, running=running, waiting=queued, waiting_capacity=queued, kv_usage=kv,
                      endpoints=len(seen), fresh=len(seen), age_seconds=0.0, latency=latency,
                      latency_window_seconds=window)


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def simulate(scenario: Scenario, decide: Decide, per_request: PerRequest | None = None) -> Run:
    """Run ``scenario`` under ``decide`` (every interval) and, for a per-request limiter,
    ``per_request`` (after every answer; its width applies at once)."""
    sc = scenario
    rng = random.Random(sc.seed)
    mu = math.log(sc.service_s) - sc.sigma ** 2 / 2
    run = Run(sc)
    bounds = Bounds(sc.floor, sc.ceiling)
    memo: dict = {}
    scrapes = Scrapes(sc, memo)
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

    slots = [split(max(c for _, c in sc.capacity), sc.replicas)[i] for i in range(sc.replicas)]

    def kv_share(replica: _Replica, seqs: int) -> float:
        """One running request's share of the replica's cache (token accounting)."""
        if replica.capacity >= seqs:
            return sc.kv_at_full / seqs  # max_num_seqs binds: the cache is kv_at_full used at a full batch
        return 1.0 / replica.capacity  # the cache binds: full at the capacity

    def gauges_now() -> tuple:
        return tuple((r.running, len(r.queue), min(1.0, r.running * kv_share(r, seqs)) if r.capacity else 1.0)
                     for r, seqs in zip(replicas, slots))

    def account(now: float) -> None:
        nonlocal last_t
        run.account(now - last_t, sc.capacity_at(last_t), in_flight, sum(r.running for r in replicas), waiting)
        last_t = now

    def start(now: float, replica: _Replica, rid: int, gen: int, admitted_at: float, waited: bool) -> None:
        replica.running += 1
        run.peak_running_over = max(run.peak_running_over, replica.running - replica.capacity)
        service = rng.lognormvariate(mu, sc.sigma)
        if sc.itl_slope:
            itl = sc.itl_s * (1 + sc.itl_slope * replica.running) * service / sc.service_s
            service = itl * sc.service_s / sc.itl_s
            for i, le in enumerate(ITL_BUCKETS):
                if itl <= le:
                    replica.itl[i] += 1
            if now >= sc.cycles * sc.interval_s / 2:
                run.itl_late.append(itl)
        push(now + service, "done", (replica, rid, gen, now, admitted_at, waited))

    def admit(now: float) -> None:
        nonlocal in_flight, waiting, admitted, next_id
        while in_flight < width and waiting > 0:
            waiting -= 1
            in_flight += 1
            admitted += 1
            run.admitted += 1
            next_id += 1
            background = rng.random() < sc.background_share
            replica = max(replicas, key=lambda r: (r.capacity - r.running, -len(r.queue)))
            if replica.running < replica.capacity:
                start(now, replica, next_id, generation, now, False)
            elif sc.mode == "overload":
                push(now + sc.reject_s, "reject", (generation, background, now))
            else:
                run.waited += 1
                min(replicas, key=lambda r: len(r.queue)).queue.append((next_id, generation, background, now))
        history.append((now, gauges_now()))

    def release(now: float, outcome: Outcome | None = None) -> None:
        nonlocal in_flight, width
        in_flight -= 1
        if per_request is not None and outcome is not None:
            new = bounds.clamp(per_request(outcome, bounds, memo))
            if new != width:
                run.changes += 1
                run.cuts += new < width
                width = new
        admit(now)

    def lagged_gauges(now: float) -> Gauges | None:
        lag = scrapes.lag(now)
        if lag is None or isinstance(lag, Gauges):
            return lag
        # History is kept for the longest lag; the reading is the last snapshot at or before now - lag.
        while len(history) > 1 and history[1][0] <= now - scrapes.longest_lag:
            history.popleft()
        seen = history[0][1] if history else tuple((0, 0, 0.0) for _ in replicas)
        for t, snapshot in history:
            if t <= now - lag:
                seen = snapshot
            else:
                break
        itl = [list(zip(ITL_BUCKETS, r.itl)) for r in replicas] if sc.itl_slope else None
        return scrapes.reading(now, list(seen), itl)

    push(0.0, "tick0")
    if sc.arrival_rate is not None:
        push(rng.expovariate(sc.arrival_rate), "arrive")
    for start_t, _ in sc.capacity[1:]:
        push(start_t, "capacity")
    end = sc.cycles * sc.interval_s
    last_decision = 0.0
    last_change: float | None = None
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
            replica, _rid, _gen, _started, admitted_at, waited = data
            replica.running -= 1
            run.served += 1
            completions += 1
            # The lane's view of a call: admission to answer, its wait in vLLM's queue
            # included (what the walkers report live), not the backend's service time alone.
            served_seconds += now - admitted_at
            if replica.queue and replica.running < replica.capacity:
                rid, gen, _bg, queued_at = replica.queue.pop(0)
                start(now, replica, rid, gen, queued_at, True)
            release(now, Outcome(False, waited, now - admitted_at, in_flight, width))
        elif kind == "reject":
            gen, background, admitted_at = data
            run.rejected += 1
            release(now, Outcome(True, False, now - admitted_at, in_flight, width))
            if not background and gen == generation:
                overloads += 1
                if overload_in_flight is None:
                    overload_in_flight = in_flight
        elif kind == "capacity":
            for replica, share in zip(replicas, split(sc.capacity_at(now), sc.replicas)):
                replica.capacity = share
                while replica.queue and replica.running < replica.capacity:
                    rid, gen, _bg, queued_at = replica.queue.pop(0)
                    start(now, replica, rid, gen, queued_at, True)
            admit(now)
        elif kind == "tick":
            elapsed = now - last_decision
            signals = Signals(
                width=width, in_flight=in_flight, waiting=waiting, admitted=admitted, overloads=overloads,
                overload_in_flight=overload_in_flight, completions=completions,
                served_concurrency=served_seconds / elapsed if elapsed > 0 else None,
                window_seconds=elapsed if elapsed > 0 else None,
                gauges=lagged_gauges(now),
                configured=sc.start_width,
                width_age_seconds=None if last_change is None else now - last_change,
            )
            new = bounds.clamp(decide(signals, bounds, memo))
            completions, served_seconds, last_decision = 0, 0.0, now
            if new != width:
                run.changes += 1
                run.cuts += new < width
                width = new
                last_change = now
                generation += 1
                admitted = overloads = 0
                overload_in_flight = None
                admit(now)
            run.widths.append(width)
            run.capacities.append(sc.capacity_at(now))
            push(now + sc.interval_s, "tick")
    return run

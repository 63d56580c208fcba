"""The control benchmark's scenarios in front of the simulator's engines (``lanes.sim.EngineCore``).

``lanes/control/simulate.py`` hides a capacity and serves each request in a
time drawn apart from what else runs. Here the same :class:`Scenario` drives
the simulator's engines on an injected clock, and its answer is the same
:class:`Run`, so the benchmark prints the same columns:

- each of ``replicas`` engines runs the step law (a + b x batch + c x context,
  + prefill; Llama-3.1-8B on one H100): every request admitted slows the
  others, so a call at a full batch takes longer than one alone;
- a request is a 1,000-token prompt and an answer of ``service_s`` alone
  (about 155 tokens a second), its length drawn lognormal with the
  scenario's ``sigma``;
- the scenario's capacity is what the engines can run: ``max_num_seqs`` is
  the largest capacity of its schedule, split over the engines, and the KV
  cache holds ``1 / kv_at_full`` of what that batch needs; a lower capacity is
  the cache binding (the cache holds that many whole requests, so past it the
  newest are preempted or wait, as vLLM does);
- ``mode="gauges"``: past what an engine can run, a request waits in its queue
  (or is preempted); ``mode="overload"``: a gateway in front of each engine
  answers 529 once the engine holds its capacity (``reject_s`` later);
- gauges are each engine's per-step snapshots, seen ``lag`` later; the latency
  law reads the engines' inter-token histograms.

Over-admission ("over req") is the share of admitted requests that waited in
an engine's queue, were preempted, or were answered 529. A hosted API (no
engine to model: tens of thousands of requests at once) stays on the
hidden-capacity harness.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

from lanes.control.laws import Bounds, Gauges, Signals
from lanes.control.simulate import Decide, Outcome, PerRequest, Run, Scenario, Scrapes, split
from lanes.sim import EngineCore, SimModel, SimRequest
from lanes.sim.engine import FINISHED
from lanes.sim.model import H100_LLAMA_8B, new_rng

PROMPT_TOKENS = 1000


def answer_tokens(service_s: float) -> int:
    """Tokens one request generates alone in ``service_s`` (the step law's time per token, batch 1)."""
    alone_ms = H100_LLAMA_8B.per_token_ms + H100_LLAMA_8B.per_seq_ms
    return max(1, round(service_s * 1000 / alone_ms))


def _kv_blocks(model: SimModel, capacity: int, answer: int, kv_at_full: float) -> int:
    """A cache that holds ``capacity`` whole requests, ``kv_at_full`` used."""
    return max(1, math.ceil(capacity * model.blocks_for(PROMPT_TOKENS + answer) / kv_at_full))


def simulate_on_engines(sc: Scenario, decide: Decide, per_request: PerRequest | None = None) -> Run:
    """Run ``sc`` under ``decide`` (every interval) and ``per_request`` (after every answer)."""
    rng = random.Random(sc.seed)
    answer = answer_tokens(sc.service_s)
    mu = math.log(answer) - sc.sigma ** 2 / 2
    largest = max(c for _, c in sc.capacity)
    seqs = split(largest, sc.replicas)
    memo: dict = {}
    scrapes = Scrapes(sc, memo)
    # The engines keep their step snapshots for the longest lag a scrape asks for.
    base = SimModel(name="m", capacity=1, metrics_lag_s=scrapes.longest_lag)
    cores = [EngineCore(replace(base, capacity=max(1, s)), new_rng(base, i)) for i, s in enumerate(seqs)]

    def set_capacity(total: int) -> None:
        for core, share in zip(cores, split(total, sc.replicas)):
            full = sc.kv_at_full if total >= largest else 1.0
            core.model = replace(core.model, kv_blocks=_kv_blocks(core.model, max(1, share), answer, full))

    set_capacity(sc.capacity_at(0.0))
    run = Run(sc)
    bounds = Bounds(sc.floor, sc.ceiling)
    width, generation = sc.start_width, 0
    in_flight = admitted = overloads = completions = 0
    overload_in_flight: int | None = None
    waiting = 0 if sc.arrival_rate is not None else 10 ** 9  # in the lane
    served_seconds = 0.0
    held: dict[int, tuple[float, int, bool]] = {}  # id(request) -> (admitted at, generation, background)
    rejects: list[tuple[float, int, bool, float]] = []  # (answered at, generation, background, admitted at)
    half = sc.cycles * sc.interval_s / 2
    itl_half: list[list[float]] | None = None
    last_t = 0.0

    def running() -> int:
        return sum(len(core.running) for core in cores)

    def account(now: float) -> None:
        nonlocal last_t
        run.account(now - last_t, sc.capacity_at(last_t), in_flight, running(), waiting)
        last_t = now

    def admit(now: float) -> None:
        nonlocal in_flight, waiting, admitted
        touched = []
        while in_flight < width and waiting > 0:
            waiting -= 1
            in_flight += 1
            admitted += 1
            run.admitted += 1
            background = rng.random() < sc.background_share
            tokens = max(1, round(rng.lognormvariate(mu, sc.sigma)))
            index = min(range(len(cores)), key=lambda i: cores[i].unfinished())
            core = cores[index]
            if sc.mode == "overload" and core.unfinished() >= split(sc.capacity_at(now), sc.replicas)[index]:
                rejects.append((now + sc.reject_s, generation, background, now))
                continue
            request = SimRequest(prompt_tokens=PROMPT_TOKENS, max_tokens=tokens, arrived=now, queued_at=now)
            held[id(request)] = (now, generation, background)
            core.add(request)
            touched.append(core)
        for core in set(touched):
            collect(core.advance(now), now)

    def release(now: float, outcome: Outcome) -> None:
        nonlocal in_flight, width
        in_flight -= 1
        if per_request is not None:
            new = bounds.clamp(per_request(outcome, bounds, memo))
            if new != width:
                run.changes += 1
                run.cuts += new < width
                width = new

    def collect(changed: list[SimRequest], now: float) -> None:
        nonlocal completions, served_seconds
        for request in changed:
            if request.state != FINISHED:
                continue
            admitted_at, _gen, _bg = held.pop(id(request))
            run.served += 1
            run.waited += request.left_waiting  # left waiting by a schedule, or preempted
            run.waited_for_room += request.waited_for_room
            completions += 1
            served_seconds += now - admitted_at
            release(now, Outcome(False, request.left_waiting, now - admitted_at, in_flight, width))

    def itl_buckets() -> list[list[tuple[float, float]]]:
        return [[(float(le), float(n)) for le, n in core.counters.inter_token.cumulative()] for core in cores]

    def gauges(now: float) -> Gauges | None:
        lag = scrapes.lag(now)
        if lag is None or isinstance(lag, Gauges):
            return lag
        seen = [core.published.at(now, lag) for core in cores]
        return scrapes.reading(now, [(g.running, g.waiting_capacity, g.kv_usage) for g in seen], itl_buckets())

    end = sc.cycles * sc.interval_s
    changes = [t for t, _ in sc.capacity[1:]]
    next_tick, last_decision = sc.interval_s, 0.0
    next_arrival = rng.expovariate(sc.arrival_rate) if sc.arrival_rate is not None else None
    last_change: float | None = None
    now = 0.0
    admit(now)
    while True:
        wakeups = [w for w in (core.next_wakeup(now) for core in cores) if w is not None]
        upcoming = [*wakeups, next_tick, *changes[:1], *([rejects[0][0]] if rejects else []),
                    *([next_arrival] if next_arrival is not None else [])]
        now = max(now, min(upcoming))
        if now > end:
            break
        account(now)
        if itl_half is None and now >= half:
            itl_half = itl_buckets()
        for core in cores:
            wakeup = core.next_wakeup(now)
            if wakeup is not None and wakeup <= now:
                collect(core.advance(now), now)
        while rejects and rejects[0][0] <= now:
            _, gen, background, admitted_at = rejects.pop(0)
            run.rejected += 1
            release(now, Outcome(True, False, now - admitted_at, in_flight, width))
            if not background and gen == generation:
                overloads += 1
                if overload_in_flight is None:
                    overload_in_flight = in_flight
        if changes and now >= changes[0]:
            changes.pop(0)
            set_capacity(sc.capacity_at(now))
            for core in cores:
                collect(core.advance(now), now)
        if next_arrival is not None and now >= next_arrival:
            waiting += 1
            next_arrival = now + rng.expovariate(sc.arrival_rate)
        admit(now)
        if now >= next_tick:
            elapsed = now - last_decision
            signals = Signals(
                width=width, in_flight=in_flight, waiting=waiting, admitted=admitted, overloads=overloads,
                overload_in_flight=overload_in_flight, completions=completions,
                served_concurrency=served_seconds / elapsed if elapsed > 0 else None,
                window_seconds=elapsed if elapsed > 0 else None, gauges=gauges(now), configured=sc.start_width,
                width_age_seconds=None if last_change is None else now - last_change,
            )
            new = bounds.clamp(decide(signals, bounds, memo))
            completions, served_seconds, last_decision = 0, 0.0, now
            if new != width:
                run.changes += 1
                run.cuts += new < width
                width, last_change = new, now
                generation += 1
                admitted = overloads = 0
                overload_in_flight = None
                admit(now)
            run.widths.append(width)
            run.capacities.append(sc.capacity_at(now))
            next_tick += sc.interval_s
    if itl_half is not None:
        late = [[(le, c - b) for (le, c), (_, b) in zip(cur, old)] for cur, old in zip(itl_buckets(), itl_half)]
        run.itl_buckets = [(le, sum(engine[i][1] for engine in late)) for i, (le, _) in enumerate(late[0])]
    return run

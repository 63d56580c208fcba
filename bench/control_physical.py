"""Control laws in front of the simulator's physical engines (``lanes.sim.EngineCore``).

The control benchmark's own harness (``lanes/control/simulate.py``) hides a
capacity and serves each request in a fixed time, whatever else runs. Here the
backend is the simulator's engine on an injected clock: each step costs
a + b x batch + c x context (+ prefill), fitted to Llama-3.1-8B on one H100, so
every request admitted slows every other one, and ``max_num_seqs`` and the KV
cache are limits, not a capacity a law can find by watching for waiting work.

One lane (an endless backlog, or Poisson arrivals) in front of ``replicas``
engines; a request goes to the engine with the fewest unfinished sequences;
gauges are each engine's per-step snapshots, ``lag_s`` old; a decision every
``interval_s``. Per law: the width it ends at, what the engines run, and what
that costs the callers (inter-token time, time to first token) and gives
(tokens/s), over the last half of the run. Deterministic: the same table on
any machine.

The field table runs the same engines in the field's conditions of the main
benchmark (bench_control.py's F rows): a scrape at most every 12 s with 3-6 s
of lag, failed scrapes, a long-context burst that makes the KV cache bind, a
load below what the engines can run, answers of varied length. There,
over-admission is the share of requests that waited in an engine's queue
(vLLM's ``num_requests_waiting``) or were preempted: what a width above what
the engines can run costs. Beside it, **room**, a part of it: the requests that
waited for a slot (``max_num_seqs``) or the KV cache, or were preempted. The rest waited only
for a step's token budget (about 7 prompts of 1,000 tokens a step), which a burst
of admissions meets at any width: a fixed width at the engines' bound pays it at
its start.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Callable

from lanes.control.laws import Bounds, Gauges, Signals, wants_reading
from lanes.control.simulate import Scenario
from lanes.sim import EngineCore, SimModel, SimRequest
from lanes.sim.engine import FINISHED
from lanes.sim.model import new_rng

Decide = Callable[[Signals, Bounds, dict], int]


@dataclass(frozen=True)
class PhysicalScenario:
    name: str
    start_width: int = 8
    replicas: int = 2
    max_num_seqs: int = 256
    kv_blocks: int = 24_576  # 393k tokens of 16: an H100's KV cache for an 8B model at 0.9 memory use
    prompt_tokens: int = 1000
    answer_tokens: int = 200
    # Answer lengths drawn lognormal with this sigma about ``answer_tokens`` (0: every answer that
    # long). Equal lengths keep the requests admitted together finishing together, in waves.
    answer_sigma: float = 0.0
    interval_s: float = 5.0
    lag_s: float = 1.0
    cycles: int = 24
    ceiling: int = 2000
    # The field's conditions (defaults: a fresh reading every decision, as the table above):
    scrape_s: float | None = None  # least time between two scrapes (None: one every decision)
    lag_range: tuple[float, float] | None = None  # each scrape's lag drawn in this range (None: lag_s)
    scrape_fail: float = 0.0  # share of scrapes that time out
    arrival_rate: float | None = None  # requests a second, Poisson (None: an endless backlog)
    prompts: tuple[tuple[float, int], ...] = ()  # (from time, prompt tokens): a change of prompt length
    seed: int = 7

    def prompt_at(self, t: float) -> int:
        current = self.prompt_tokens
        for start, tokens in self.prompts:
            if t >= start:
                current = tokens
        return current


@dataclass
class PhysicalRun:
    widths: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)  # the engines' running count at each decision
    itl_ms: float = 0.0
    ttft_ms: float = 0.0
    tokens_per_s: float = 0.0
    preemptions: int = 0
    admitted: int = 0
    waited: int = 0  # requests that waited in an engine's queue or were preempted
    waited_for_room: int = 0  # of those, for a slot or the KV cache, not only a step's token budget

    @property
    def over_requests(self) -> float:
        return self.waited / self.admitted if self.admitted else 0.0

    @property
    def over_room(self) -> float:
        return self.waited_for_room / self.admitted if self.admitted else 0.0


def simulate_physical(sc: PhysicalScenario, decide: Decide) -> PhysicalRun:
    # The engines keep their step snapshots for the longest lag a scrape asks for (a shorter
    # keep would show a scrape 6 s behind what is only 3 s old).
    longest_lag = sc.lag_range[1] if sc.lag_range else sc.lag_s
    model = SimModel(name="m", capacity=sc.max_num_seqs, kv_blocks=sc.kv_blocks, tokens=sc.answer_tokens,
                     metrics_lag_s=longest_lag)
    cores = [EngineCore(model, new_rng(model, i)) for i in range(sc.replicas)]
    arrivals = random.Random(sc.seed)
    scrapes = random.Random(sc.seed + 1)  # apart, so scrapes never shift arrivals
    lengths = random.Random(sc.seed + 2)
    mu = math.log(sc.answer_tokens) - sc.answer_sigma ** 2 / 2  # the lengths' mean is answer_tokens
    bounds = Bounds(1, sc.ceiling)
    memo: dict = {}
    run = PhysicalRun()
    width, in_flight, admitted, completions = sc.start_width, 0, 0, 0
    waiting = 10 ** 9 if sc.arrival_rate is None else 0  # in the lane
    served_seconds = 0.0
    half = sc.cycles * sc.interval_s / 2
    ttfts: list[float] = []
    tokens_at_half = None
    itl_at_half = (0.0, 0)
    last_scrape: float | None = None
    last_change: float | None = None

    def admit(now: float) -> None:
        nonlocal in_flight, admitted, waiting
        touched = set()
        while in_flight < width and waiting > 0:
            core = min(cores, key=lambda c: c.unfinished())
            tokens = sc.answer_tokens
            if sc.answer_sigma:
                tokens = max(1, round(lengths.lognormvariate(mu, sc.answer_sigma)))
            request = SimRequest(prompt_tokens=sc.prompt_at(now), max_tokens=tokens, arrived=now,
                                 queued_at=now)
            core.add(request)
            touched.add(id(core))
            in_flight += 1
            admitted += 1
            waiting -= 1
            run.admitted += 1
        for core in cores:
            if id(core) in touched:
                collect(core.advance(now), now)

    def collect(changed: list[SimRequest], now: float) -> None:
        nonlocal in_flight, completions, served_seconds
        for request in changed:
            if request.state == FINISHED:
                in_flight -= 1
                completions += 1
                run.waited += request.left_waiting  # the engine left it waiting at least once
                run.waited_for_room += request.waited_for_room
                served_seconds += request.last_token_at - request.arrived
                if request.arrived >= half:
                    ttfts.append(request.first_token_at - request.arrived)

    def gauges(now: float) -> Gauges | None:
        nonlocal last_scrape
        if (sc.scrape_s is not None and last_scrape is not None and now - last_scrape < sc.scrape_s - 1e-9
                and not wants_reading(memo)):
            return None  # no new reading this decision, as the control loop's cadence
        last_scrape = now
        if sc.scrape_fail and scrapes.random() < sc.scrape_fail:
            return Gauges(ok=False, error="timed out")
        lag = scrapes.uniform(*sc.lag_range) if sc.lag_range else sc.lag_s
        seen = [core.published.at(now, lag) for core in cores]
        return Gauges(ok=True, running=sum(g.running for g in seen), waiting=sum(g.waiting for g in seen),
                      waiting_capacity=sum(g.waiting_capacity for g in seen),
                      kv_usage=statistics.fmean(g.kv_usage for g in seen), endpoints=len(seen), fresh=len(seen))

    def generated() -> int:
        return sum(core.counters.generation_tokens for core in cores)

    now, next_tick, last_decision = 0.0, sc.interval_s, 0.0
    next_arrival = arrivals.expovariate(sc.arrival_rate) if sc.arrival_rate else None
    admit(now)
    end = sc.cycles * sc.interval_s
    for _ in range(50_000_000):
        wakeups = [w for w in (core.next_wakeup(now) for core in cores) if w is not None]
        now = min([*wakeups, next_tick, *([next_arrival] if next_arrival is not None else [])])
        if now > end:
            break
        if tokens_at_half is None and now >= half:
            tokens_at_half = generated()
            itl_at_half = (sum(c.counters.inter_token.sum for c in cores),
                           sum(c.counters.inter_token.count for c in cores))
        for core in cores:
            wakeup = core.next_wakeup(now)
            if wakeup is not None and wakeup <= now:
                collect(core.advance(now), now)
        if next_arrival is not None and now >= next_arrival:
            waiting += 1
            next_arrival = now + arrivals.expovariate(sc.arrival_rate)
        admit(now)
        if now >= next_tick:
            elapsed = now - last_decision
            signals = Signals(width=width, in_flight=in_flight, waiting=waiting, admitted=admitted,
                              completions=completions, served_concurrency=served_seconds / elapsed,
                              window_seconds=elapsed, gauges=gauges(now), configured=sc.start_width,
                              width_age_seconds=None if last_change is None else now - last_change)
            new = bounds.clamp(decide(signals, bounds, memo))
            completions, served_seconds, last_decision = 0, 0.0, now
            if new != width:
                width, admitted, last_change = new, 0, now
                admit(now)
            run.widths.append(width)
            run.running.append(sum(len(core.running) for core in cores))
            next_tick += sc.interval_s
    itl_sum = sum(c.counters.inter_token.sum for c in cores) - itl_at_half[0]
    itl_count = sum(c.counters.inter_token.count for c in cores) - itl_at_half[1]
    run.itl_ms = itl_sum / itl_count * 1000 if itl_count else float("nan")
    run.ttft_ms = statistics.median(ttfts) * 1000 if ttfts else float("nan")
    run.tokens_per_s = (generated() - (tokens_at_half or 0)) / (end - half)
    run.preemptions = sum(core.counters.preemptions for core in cores)
    return run


def fixed(width: int) -> Decide:
    return lambda s, b, memo: width


def print_table(laws: dict[str, Decide], smoke: bool) -> None:
    sc = PhysicalScenario("two H100s, Llama-3.1-8B step law, 1000-token prompts, 200-token answers",
                          cycles=8 if smoke else 24)
    print()
    print(f"physical backend: {sc.name}, max_num_seqs {sc.max_num_seqs} per engine, "
          f"a decision every {sc.interval_s:.0f} s, gauges {sc.lag_s:.0f} s old ({sc.cycles} decisions)")
    print(f"{'law':20} {'width (last half)':>18} {'running':>9} {'ITL ms':>8} {'TTFT p50 ms':>12} {'tokens/s':>9} "
          f"{'preempt':>8}")
    rows = {**laws, "fixed width 16": fixed(16), "fixed width 64": fixed(64),
            f"fixed width {2 * sc.max_num_seqs}": fixed(2 * sc.max_num_seqs)}
    for name, law in rows.items():
        run = simulate_physical(sc, law)
        tail = run.widths[len(run.widths) // 2:]
        running = run.running[len(run.running) // 2:]
        print(f"{name:20} {f'{min(tail)}..{max(tail)}':>18} {f'{min(running)}..{max(running)}':>9} "
              f"{run.itl_ms:8.2f} {run.ttft_ms:12.0f} {run.tokens_per_s:9.0f} {run.preemptions:8}", flush=True)


def field_scenarios(smoke: bool) -> list[PhysicalScenario]:
    """The main benchmark's field conditions on the physical engines: a scrape at most every
    12 s, each 3-6 s old, failed scrapes, a long-context burst (8,000-token prompts for 30 s:
    the KV cache binds at about 47 a engine instead of max_num_seqs), a load below the bound.
    Answers vary in length as the engines' field rows' do (lognormal, sigma 0.3): with every
    answer 200 tokens long, the requests a growth admits together finish together for the rest of
    the run, and each wave's prompts wait for the step's token budget at once (a field has no
    such waves; they held most seeds' widths far below the bound)."""
    cycles = 12 if smoke else 80
    field = dict(cycles=cycles, scrape_s=12.0, lag_range=(3.0, 6.0), answer_sigma=Scenario.sigma)
    found = [PhysicalScenario("P0 from 8, field gauges", **field)]
    if smoke:
        return found
    return found + [
        PhysicalScenario("P2 10 % of scrapes fail", scrape_fail=0.10, **field),
        PhysicalScenario("P3 20 % of scrapes fail", scrape_fail=0.20, **field),
        PhysicalScenario("P12 long-context burst", prompts=((150.0, 8000), (180.0, 1000)), **field),
        PhysicalScenario("P9 20 requests/s (below the bound)", arrival_rate=20.0, **field),
    ]


def print_field_table(laws: dict[str, Decide], smoke: bool) -> None:
    print()
    print("physical backend in the field: the engines above, a scrape at most every 12 s, 3-6 s old, a "
          "decision every 5 s; over = requests that waited in an engine's queue or were preempted; room = "
          "the part of them that waited for a slot or the KV cache (or were preempted), not only for a "
          "step's token budget")
    print(f"{'scenario':36} {'law':20} {'width (last half)':>18} {'running':>9} {'over':>6} {'room':>6} "
          f"{'ITL ms':>7} {'TTFT p50':>9} {'tokens/s':>9} {'preempt':>8}")
    for sc in field_scenarios(smoke):
        # The engines' own cost at their bound (max_num_seqs over both): a request that arrives
        # while the step's token budget is spent waits in the queue even at a fixed width.
        bound = sc.max_num_seqs * sc.replicas
        for name, law in {**laws, f"fixed width {bound}": fixed(bound)}.items():
            run = simulate_physical(sc, law)
            tail = run.widths[len(run.widths) // 2:]
            running = run.running[len(run.running) // 2:]
            print(f"{sc.name:36} {name:20} {f'{min(tail)}..{max(tail)}':>18} "
                  f"{f'{min(running)}..{max(running)}':>9} {run.over_requests:>6.1%} {run.over_room:>6.1%} "
                  f"{run.itl_ms:7.1f} {run.ttft_ms:9.0f} "
                  f"{run.tokens_per_s:9.0f} {run.preemptions:8}", flush=True)

"""Control laws in front of the simulator's physical engines (``lanes.sim.EngineCore``).

The control benchmark's own harness (``lanes/control/simulate.py``) hides a
capacity and serves each request in a fixed time, whatever else runs. Here the
backend is the simulator's engine on an injected clock: each step costs
a + b x batch + c x context (+ prefill), fitted to Llama-3.1-8B on one H100, so
every request admitted slows every other one, and ``max_num_seqs`` and the KV
cache are limits, not a capacity a law can find by watching for waiting work.

One lane (an endless backlog) in front of ``replicas`` engines; a request goes
to the engine with the fewest unfinished sequences; gauges are each engine's
per-step snapshots, ``lag_s`` old; a decision every ``interval_s``. Per law:
the width it ends at, what the engines run, and what that costs the callers
(inter-token time, time to first token) and gives (tokens/s), over the last
half of the run. Deterministic: the same table on any machine.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable

from lanes.control.laws import Bounds, Gauges, Signals
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
    interval_s: float = 5.0
    lag_s: float = 1.0
    cycles: int = 24
    ceiling: int = 2000


@dataclass
class PhysicalRun:
    widths: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)  # the engines' running count at each decision
    itl_ms: float = 0.0
    ttft_ms: float = 0.0
    tokens_per_s: float = 0.0
    preemptions: int = 0


def simulate_physical(sc: PhysicalScenario, decide: Decide) -> PhysicalRun:
    model = SimModel(name="m", capacity=sc.max_num_seqs, kv_blocks=sc.kv_blocks, tokens=sc.answer_tokens)
    cores = [EngineCore(model, new_rng(model, i)) for i in range(sc.replicas)]
    bounds = Bounds(1, sc.ceiling)
    memo: dict = {}
    run = PhysicalRun()
    width, in_flight, admitted, completions = sc.start_width, 0, 0, 0
    served_seconds = 0.0
    owner: dict[int, EngineCore] = {}
    half = sc.cycles * sc.interval_s / 2
    ttfts: list[float] = []
    tokens_at_half = None
    itl_at_half = (0.0, 0)

    def admit(now: float) -> None:
        nonlocal in_flight, admitted
        touched = set()
        while in_flight < width:
            core = min(cores, key=lambda c: c.unfinished())
            request = SimRequest(prompt_tokens=sc.prompt_tokens, max_tokens=sc.answer_tokens, arrived=now,
                                 queued_at=now)
            core.add(request)
            owner[id(request)] = core
            touched.add(id(core))
            in_flight += 1
            admitted += 1
        for core in cores:
            if id(core) in touched:
                collect(core.advance(now), now)

    def collect(changed: list[SimRequest], now: float) -> None:
        nonlocal in_flight, completions, served_seconds
        for request in changed:
            if request.state == FINISHED:
                in_flight -= 1
                completions += 1
                served_seconds += request.last_token_at - request.arrived
                if request.arrived >= half:
                    ttfts.append(request.first_token_at - request.arrived)

    def gauges(now: float) -> Gauges:
        seen = [core.published.at(now, sc.lag_s) for core in cores]
        return Gauges(ok=True, running=sum(g.running for g in seen), waiting=sum(g.waiting for g in seen),
                      waiting_capacity=sum(g.waiting_capacity for g in seen),
                      kv_usage=statistics.fmean(g.kv_usage for g in seen))

    def generated() -> int:
        return sum(core.counters.generation_tokens for core in cores)

    now, next_tick, last_decision = 0.0, sc.interval_s, 0.0
    admit(now)
    end = sc.cycles * sc.interval_s
    for _ in range(10_000_000):
        wakeups = [w for w in (core.next_wakeup(now) for core in cores) if w is not None]
        now = min([*wakeups, next_tick])
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
        admit(now)
        if now >= next_tick:
            elapsed = now - last_decision
            signals = Signals(width=width, in_flight=in_flight, waiting=10 ** 6, admitted=admitted,
                              completions=completions, served_concurrency=served_seconds / elapsed,
                              window_seconds=elapsed, gauges=gauges(now))
            new = bounds.clamp(decide(signals, bounds, memo))
            completions, served_seconds, last_decision = 0, 0.0, now
            if new != width:
                width, admitted = new, 0
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

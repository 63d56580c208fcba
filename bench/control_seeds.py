"""The control benchmark over several seeds: how much of a law's figure is its seed's.

    python bench/bench_control.py --seeds 6           # every field scenario, seeds 7..12
    python bench/bench_control.py --seeds 12 --first-seed 1   # seeds 1..12, as the journal's later rounds
    python bench/bench_control.py --seeds 6 --smoke   # two scenarios, to prove it runs

One seed (7, the tables above) is one draw of service times, scrape lags and failed
scrapes; a law tuned against it can hold only there. Each row here runs a law on the
same scenario with seeds 7, 8, ... and prints the mean and the worst: the share of
requests that waited in vLLM (or an engine's queue); the mean share that waited for a
slot or the KV cache (``room``, a part of the first: not only for a step's token
budget); the idle share, how many runs settled within +-10 % of the capacity, and the
lowest and highest width of the runs' last halves. The engines' field scenarios run, less F0 (an hour each) and F10 (bound by
latency, which has its own row above); then the physical engines' field scenarios.
"""

from __future__ import annotations

import multiprocessing
import statistics
from dataclasses import replace

import bench_control as bc
import control_physical as cp
from control_engines import simulate_on_engines

FIRST_SEED = 7


def _engine_cases(smoke: bool) -> list[tuple[str, list[str]]]:
    chosen = []
    for scenario, laws, _since in bc.field_scenarios(smoke):
        if scenario.name.startswith(("F0 ", "F10 ")):
            continue
        chosen.append((scenario.name, [*laws, *bc.oracles(scenario)]))
    return chosen


def _physical_cases(smoke: bool) -> list[tuple[str, list[str]]]:
    return [(sc.name, [*bc.GAUGE_LAWS, f"fixed width {sc.max_num_seqs * sc.replicas}"])
            for sc in cp.field_scenarios(smoke)]


def _run(job: tuple[str, str, str, int, bool]) -> tuple[str, str, dict]:
    """One law on one scenario at one seed (in a worker: laws and scenarios are rebuilt by name)."""
    kind, name, law_name, seed, smoke = job
    if kind == "engines":
        scenario, laws, since = next(entry for entry in bc.field_scenarios(smoke) if entry[0].name == name)
        scenario = replace(scenario, seed=seed)
        law = bc.oracles(scenario)[law_name] if law_name.startswith("oracle") else laws[law_name]
        run = simulate_on_engines(scenario, *law) if isinstance(law, tuple) else simulate_on_engines(scenario, law)
        low, high = run.range_after(since + (len(run.widths) - since) // 2)
        return name, law_name, {"over": run.over_requests, "room": run.over_room, "idle": run.idle_slots,
                                "low": low, "high": high, "settled": run.cycles_to_settle(since) is not None}
    scenario = replace(next(sc for sc in cp.field_scenarios(smoke) if sc.name == name), seed=seed)
    law = bc.GAUGE_LAWS.get(law_name) or cp.fixed(scenario.max_num_seqs * scenario.replicas)
    run = cp.simulate_physical(scenario, law)
    tail = run.widths[len(run.widths) // 2:]
    return name, law_name, {"over": run.over_requests, "room": run.over_room, "tokens": run.tokens_per_s,
                            "low": min(tail), "high": max(tail)}


def print_spread(seeds: int, smoke: bool, first: int = FIRST_SEED) -> None:
    jobs = [("engines", name, law, first + i, smoke)
            for name, laws in _engine_cases(smoke) for law in laws for i in range(seeds)]
    jobs += [("physical", name, law, first + i, smoke)
             for name, laws in _physical_cases(smoke) for law in laws for i in range(seeds)]
    found: dict[tuple[str, str], list[dict]] = {}
    with multiprocessing.Pool(min(2, multiprocessing.cpu_count())) as pool:
        for name, law, row in pool.imap(_run, jobs):
            found.setdefault((name, law), []).append(row)
    print()
    print(f"over {seeds} seeds ({first}..{first + seeds - 1}): mean and worst of each run's figure")
    print(f"{'scenario':40} {'law':20} {'over req':>8} {'worst':>6} {'room':>6} {'idle':>5} {'worst':>6} "
          f"{'settled':>7} {'widths':>10}")
    for (name, law), rows in found.items():
        over = [r["over"] for r in rows]
        widths = f"{min(r['low'] for r in rows)}..{max(r['high'] for r in rows)}"
        if "idle" in rows[0]:
            idle = [r["idle"] for r in rows]
            settled = f"{sum(r['settled'] for r in rows)}/{len(rows)}"
            rest = f"{statistics.fmean(idle):5.0%} {max(idle):6.0%} {settled:>7}"
        else:
            rest = f"{statistics.fmean(r['tokens'] for r in rows):>12.0f} tokens/s"
        room = statistics.fmean(r["room"] for r in rows)
        print(f"{name:40} {law:20} {statistics.fmean(over):8.1%} {max(over):6.1%} {room:6.1%} {rest} {widths:>10}",
              flush=True)

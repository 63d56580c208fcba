"""Control laws on the deterministic harness: ours against the seeds' laws and Netflix AIMD.

    python bench/bench_control.py            # every scenario (a few seconds each)
    python bench/bench_control.py --smoke    # two short scenarios, to prove it runs
    python bench/bench_control.py --hidden   # every scenario on the hidden-capacity harness
    python bench/bench_control.py --seeds 6  # the field scenarios over seeds 7..12: mean and worst
    python bench/bench_control.py --seeds 12 --first-seed 1  # over seeds 1..12

Every scenario runs in front of the simulator's engines (``bench/control_engines.py``:
the step law, where every admitted request slows the others, ``max_num_seqs`` and
the KV cache as the capacity), except a hosted API's, which has no engine to model
and keeps the hidden-capacity harness (``lanes/control/simulate.py``: a capacity
and lognormal service times that do not depend on the batch). ``--hidden`` runs
them all there, as the benchmark did before it drove the engines.

After its table, the gauge laws run again in front of the simulator's physical
engines (``bench/control_physical.py``: the step law, where every admitted
request slows the others and ``max_num_seqs`` is a limit, not a capacity).

Each scenario runs every law on the same seeded backend (two engines unless
it says otherwise, gauges lagging 1 s, 5 s intervals). Columns:

- settle: decisions until the width is and stays within +-10 % of the
  capacity ("never": it does not settle in the run); after a capacity
  change, counted from that change;
- range: the widths seen over the last half of the (last) phase;
- changes, cuts: width changes and cuts over the whole run;
- recover: decisions from the first cut until the width is back at (or above)
  the width before it ("-": no cut; "never": not in the run);
- over: share of time the lane held more requests than the backend could run;
- idle: share of the capacity left unused while work waited;
- over req: share of admitted requests that waited in vLLM's queue, were preempted
  (engines only) or were answered 529;
- itl p95: inter-token time over the last half (engines: from their histograms).

The field scenarios (F0-F12, ``--field`` alone) add the field's conditions:
gauges lagging 3-6 s, a scrape every 12 s (the default) under 5 s decisions,
a KV cache at 50 % with a full batch (KV from token accounting: a capacity
below max_num_seqs is the cache binding, so it reads full there), failed scrapes, one address in front of
two replicas, a swinging capacity and capacities of 1 and 2.

Baselines, as written: seed 000 (x0.8 on a current-generation 529, x1.5 when
every slot was used and the raise was earned); seed 002 (capacity-waiting ->
max(floor, running, 0.8 x width); running >= 0.8 x width with nothing
waiting -> +max(1, 25 %)); Netflix AIMD (x0.9 on any drop in the interval,
+1 when in-flight >= width / 2; with gauges a drop is work waiting for
capacity). The floor is the scenario's (1), not seed 002's configured width,
or it could never come down from 10x too high.

An oracle runs in every scenario on the engines: it sets the width to the capacity the
scenario has at each decision, which no law can read. What it still costs (requests
admitted before the first decision, the batch above a capacity that just dropped) is the
scenario's, not a law's. Where the capacity changes, two more learn each change one and two
decisions after it (``LATE_ORACLES``): no law learns a change before the first decision after
it, so the first bounds them all; the second is about where a reading at the default cadence
first shows it.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lanes.catalog.controllers import normalise  # noqa: E402
from lanes.control.laws import Bounds, Signals, compose  # noqa: E402
from lanes.control.simulate import Scenario, simulate  # noqa: E402

from control_engines import simulate_on_engines  # noqa: E402
from control_physical import print_field_table as physical_field_table  # noqa: E402
from control_physical import print_table as physical_table  # noqa: E402


def ours(kind: str):
    params = normalise({}, kind)
    return lambda s, b, memo: compose({kind: params}, s, b, memo).width


def ours_composed(kinds: dict[str, dict]):
    params = {kind: normalise(given, kind) for kind, given in kinds.items()}
    return lambda s, b, memo: compose(params, s, b, memo).width


def laws_at(revision: str):
    """``lanes/control/laws.py`` as it was at a git revision, loaded on its own (the before column)."""
    import importlib.util
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parent.parent
    text = subprocess.run(["git", "show", f"{revision}:lanes/control/laws.py"], cwd=root, capture_output=True,
                          text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "laws_before.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("laws_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["laws_before"] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def before(module, kind: str):
    """Our law as it was, with the parameters it knew (today's defaults, less those it did not have)."""
    params = normalise({}, kind)
    return lambda s, b, memo: module.compose({kind: params}, s, b, memo).width


def seed000(s: Signals, b: Bounds, memo: dict) -> int:
    if s.overloads > 0:
        return max(b.floor, 1, math.floor(s.width * 0.8))
    if s.in_flight >= s.width and s.waiting > 0:
        target = math.ceil(s.width * 1.5)
        if s.admitted >= target - s.width:
            return target
    return s.width


def seed002(s: Signals, b: Bounds, memo: dict) -> int:
    g = s.gauges
    if g is None:
        return s.width  # its own scrape is throttled too: no new reading, no change
    if not g.ok:
        return b.floor
    if (g.waiting_capacity or 0) > 0:
        return max(b.floor, int(g.running), math.ceil(s.width * 0.8))
    if g.running >= 0.8 * s.width:
        return s.width + max(1, math.ceil(s.width * 0.25))
    return s.width


def netflix_aimd(s: Signals, b: Bounds, memo: dict) -> int:
    dropped = s.overloads > 0 or (s.gauges is not None and (s.gauges.waiting_capacity or 0) > 0)
    if dropped:
        return max(b.floor, math.floor(s.width * 0.9))
    if s.in_flight >= s.width / 2:
        return s.width + 1
    return s.width


def _kept(s: Signals, b: Bounds, memo: dict) -> int:
    """The interval side of a per-request limiter: whatever its last answer set."""
    return s.width


def netflix_aimd_per_request(timeout_s: float = 2.0):
    """Netflix concurrency-limits' AIMDLimit as the library runs it: on every answer, x0.9 on a
    drop (a 529, or an answer slower than its timeout: 2 s, twice the mean call), else +1 when
    in flight >= limit / 2."""

    def sample(o, b: Bounds, memo: dict) -> int:
        limit = memo.get("limit", o.width)
        if o.rejected or o.rtt > timeout_s:
            limit = max(b.floor, math.floor(limit * 0.9))
        elif o.in_flight * 2 >= limit:
            limit += 1
        memo["limit"] = limit
        return limit

    return (_kept, sample)


def gradient2_per_request(o, b: Bounds, memo: dict) -> int:
    """Netflix concurrency-limits' Gradient2Limit on every answer (library defaults: smoothing
    0.2, rtt tolerance 1.5, long window 600 samples, queue size 4; it ignores drops)."""
    estimate = memo.get("estimate", float(o.width))
    long_rtt = memo.get("long_rtt")
    n = memo.get("n", 0) + 1
    memo["n"] = n
    if long_rtt is None:
        long_rtt = o.rtt
    elif n <= 10:  # the library's warm-up: a plain mean of the first samples
        long_rtt += (o.rtt - long_rtt) / n
    else:
        long_rtt += (o.rtt - long_rtt) * 2 / (600 + 1)
    if long_rtt / o.rtt > 2:
        long_rtt *= 0.95
    memo["long_rtt"] = long_rtt
    if o.in_flight < estimate / 2:
        memo["estimate"] = estimate
        return max(b.floor, int(estimate))
    gradient = max(0.5, min(1.0, 1.5 * long_rtt / o.rtt))
    new = estimate * gradient + 4
    new = estimate * 0.8 + new * 0.2
    estimate = max(b.floor, min(b.ceiling, new))
    memo["estimate"] = estimate
    return int(estimate)


GAUGE_LAWS = {"ours (vllm)": ours("vllm"), "seed 002": seed002, "Netflix AIMD": netflix_aimd}
# The field scenarios run Netflix's limiters as the library does: per answer.
FIELD_LAWS = {"ours (vllm)": ours("vllm"), "seed 002": seed002,
              "Netflix AIMD/request": netflix_aimd_per_request(),
              "Gradient2/request": (_kept, gradient2_per_request)}
OVERLOAD_LAWS = {"ours (overload)": ours("overload"), "seed 000": seed000, "Netflix AIMD": netflix_aimd}


def oracle(scenario: Scenario, late: int = 0):
    """The width the scenario's capacity is at each decision (the harnesses decide every
    ``interval_s``, the first at one interval), or was ``late`` decisions before it."""

    def decide(s: Signals, b: Bounds, memo: dict) -> int:
        memo["decisions"] = memo.get("decisions", 0) + 1
        return scenario.capacity_at(max(0, memo["decisions"] - late) * scenario.interval_s)

    return decide


# Oracles that learn a change of capacity decisions after it. A law learns it from a reading
# taken after the change by more than the gauges' lag: a reading at every decision with no lag
# would learn it at the first decision after (+1); at the default cadence (a scrape every third
# 5-s decision, 3-6 s old) the first reading that shows it comes 1 to 4 decisions after: 2.1, 2.3
# and 2.0 on average in F5, F6 and F12 over seeds 1..12, with the scrapes our law asks for.
LATE_ORACLES = {"oracle +1 decision": 1, "oracle +2 decisions": 2}


def oracles(scenario: Scenario) -> dict:
    """The oracle rows of a scenario on the engines: on time, and late where the capacity changes."""
    found = {"oracle": oracle(scenario)}
    if len(scenario.capacity) > 1:
        found.update({name: oracle(scenario, late) for name, late in LATE_ORACLES.items()})
    return found


def scenarios(smoke: bool) -> list[tuple[Scenario, dict, int]]:
    """(scenario, laws, the decision index its last phase starts at)."""
    cycles = 12 if smoke else 40
    found = []
    for mode, laws in (("gauges", GAUGE_LAWS), ("overload", OVERLOAD_LAWS)):
        found.append((Scenario(f"C=100 from 10 ({mode})", ((0, 100),), 10, mode=mode, cycles=cycles, ceiling=2000),
                      laws, 0))
        if smoke:
            continue
        found.append((Scenario(f"C=100 from 1000 ({mode})", ((0, 100),), 1000, mode=mode, cycles=cycles,
                               ceiling=2000), laws, 0))
        found.append((Scenario(f"C 100 -> 20 at 20 ({mode})", ((0, 100), (100.0, 20)), 100, mode=mode, cycles=40,
                               ceiling=2000), laws, 19))
        found.append((Scenario(f"C 20 -> 100 at 40 ({mode})", ((0, 100), (100.0, 20), (200.0, 100)), 100,
                               mode=mode, cycles=70, ceiling=2000), laws, 39))
    if not smoke:
        found.append((Scenario("hosted 60,000, one overload at 12 s", ((0, 1_000_000), (12.0, 48_000), (13.0, 1_000_000)),
                               60_000, mode="overload", cycles=12, ceiling=200_000, service_s=30.0, replicas=1,
                               hosted=True), OVERLOAD_LAWS, 0))
        found.append((Scenario("hosted: slow 529s after one overload", ((0, 1000), (12.0, 400), (12.5, 1000)), 1000,
                               mode="overload", cycles=12, ceiling=2000, reject_s=3.0, hosted=True),
                      OVERLOAD_LAWS, 0))
        found.append((Scenario("rejects every request", ((0, 0),), 40, mode="overload", cycles=20), OVERLOAD_LAWS, 0))
        util = {"ours (utilisation)": ours("utilisation")}
        found.append((Scenario("load 85 % of capacity, width 85", ((0, 100),), 85, mode="gauges", cycles=40,
                               arrival_rate=85.0), {**util, **GAUGE_LAWS}, 0))
    return found


def field_scenarios(smoke: bool) -> list[tuple[Scenario, dict, int]]:
    """The field's conditions: 3-6 s gauge lag, a scrape every 12 s (decisions every 5 s), a KV
    cache at 50 % when the batch is full (max_num_seqs binds first), failed scrapes, one address
    in front of two replicas, a capacity that swings, noisy gauges, a long-context burst, tiny
    capacities, decode steps that slow with the batch."""
    cycles = 12 if smoke else 80
    field = dict(mode="gauges", cycles=cycles, ceiling=2000, lag_range=(3.0, 6.0), scrape_s=12.0, kv_at_full=0.5)
    found = [(Scenario("F1 C=100 from 10, field gauges", ((0, 100),), 10, **field), FIELD_LAWS, 0)]
    if smoke:
        return found
    swing20 = tuple((t * 20.0, 100 if t % 2 == 0 else 50) for t in range(cycles * 5 // 20 + 1))
    swing40 = tuple((t * 40.0, 100 if t % 2 == 0 else 50) for t in range(cycles * 5 // 40 + 1))
    latency = {"ours (vllm + latency p95 50 ms)": ours_composed({"vllm": {}, "latency": {"target_ms": 50.0}}),
               "seed 002": seed002, "Netflix AIMD/request": netflix_aimd_per_request(),
               "Gradient2/request": (_kept, gradient2_per_request)}
    found += [
        (Scenario("F0 C=100 steady state, 1 h", ((0, 100),), 100, **{**field, "cycles": 720}), FIELD_LAWS, 0),
        (Scenario("F2 10 % of scrapes fail", ((0, 100),), 100, scrape_fail=0.10, **field), FIELD_LAWS, 0),
        (Scenario("F3 20 % of scrapes fail", ((0, 100),), 100, scrape_fail=0.20, **field), FIELD_LAWS, 0),
        (Scenario("F4 2 replicas behind one address", ((0, 100),), 10, replica_view="one", **field), FIELD_LAWS, 0),
        (Scenario("F5 C 100 <-> 50 every 20 s", swing20, 100, **field), FIELD_LAWS, 0),
        (Scenario("F6 C 100 <-> 50 every 40 s", swing40, 100, **field), FIELD_LAWS, 0),
        (Scenario("F11 noisy gauges (10 % sd)", ((0, 100),), 100, gauge_noise=0.10, **field), FIELD_LAWS, 0),
        # Long prompts fill the KV cache first: capacity 100 -> 60 for 30 s, then back.
        (Scenario("F12 long-context burst", ((0, 100), (150.0, 60), (180.0, 100)), 100, **field), FIELD_LAWS, 0),
        (Scenario("F7 C=1", ((0, 1),), 1, replicas=1, **field), FIELD_LAWS, 0),
        (Scenario("F8 C=2", ((0, 2),), 2, replicas=1, **field), FIELD_LAWS, 0),
        (Scenario("F9 C=100, 85 % load, KV 50 % at full", ((0, 100),), 85, arrival_rate=85.0, **field),
         {"ours (utilisation)": ours("utilisation"), **FIELD_LAWS}, 0),
        # Decode steps slow with the batch: 10 ms per token alone, +4 % per running request.
        # Inter-token p95 stays under 50 ms up to about 50 running per replica (100 in all),
        # far below the 400 slots.
        (Scenario("F10 latency target, step time grows", ((0, 400),), 20, itl_slope=0.04, **field),
         latency, 0),
    ]
    return found


def recovery(widths: list[int], start: int) -> str:
    before = start
    for i, width in enumerate(widths):
        if width < before:
            for j in range(i + 1, len(widths)):
                if widths[j] >= before:
                    return str(j - i)
            return "never"
        before = width
    return "-"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench_control.py")
    parser.add_argument("--smoke", action="store_true", help="two short scenarios, to prove it runs")
    parser.add_argument("--field", action="store_true", help="only the field's conditions (F0-F12)")
    parser.add_argument("--before", metavar="REV", help="also run our laws as they were at git revision REV")
    parser.add_argument("--hidden", action="store_true",
                        help="every scenario on the hidden-capacity harness, none in front of the engines")
    parser.add_argument("--seeds", type=int, metavar="N",
                        help="only the field scenarios, each law over seeds 7..7+N-1: mean and worst")
    parser.add_argument("--first-seed", type=int, metavar="S", help="with --seeds: start at seed S instead of 7")
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.first_seed is not None and args.seeds is None:
        parser.error(f"--first-seed {args.first_seed}: it picks the seeds of --seeds N; give --seeds too")
    if args.seeds is not None:
        if args.seeds < 1:
            parser.error(f"--seeds {args.seeds}: give 1 or more runs a scenario")
        from control_seeds import FIRST_SEED, print_spread

        print_spread(args.seeds, args.smoke, FIRST_SEED if args.first_seed is None else args.first_seed)
        print(f"({time.monotonic() - started:.0f} s)")
        return 0
    print(f"{'scenario':40} {'law':20} {'settle':>7} {'range':>14} {'changes':>7} {'cuts':>5} {'recover':>7} "
          f"{'over':>6} {'idle':>6} {'over req':>8} {'room':>6}")
    chosen = field_scenarios(args.smoke) if args.field else scenarios(args.smoke) + field_scenarios(args.smoke)
    if args.before:
        old = laws_at(args.before)
        for i, (scenario, laws, since) in enumerate(chosen):
            # Our single laws as they were (the latency law is new: nothing to compare it with).
            added = {f"{name} @{args.before[:7]}": before(old, name.split("(")[1].rstrip(")"))
                     for name in laws if name.startswith("ours (") and name.split("(")[1].rstrip(")") in old.LAWS}
            chosen[i] = (scenario, {**laws, **added}, since)
    for scenario, laws, since in chosen:
        harness = simulate if args.hidden or scenario.hosted else simulate_on_engines
        if harness is simulate_on_engines and not scenario.name.startswith("F10"):
            # (F10's width is bound by latency, not by a capacity the oracle could know.)
            laws = {**laws, **oracles(scenario)}
        for name, law in laws.items():
            run = harness(scenario, *law) if isinstance(law, tuple) else harness(scenario, law)
            settle = run.cycles_to_settle(since)
            half = since + (len(run.widths) - since) // 2
            low, high = run.range_after(half)
            print(f"{scenario.name:40} {name:20} {settle if settle is not None else 'never':>7} "
                  f"{f'{low}..{high}':>14} {run.changes:>7} {run.cuts:>5} "
                  f"{recovery(run.widths, scenario.start_width):>7} {run.over_admission:>6.0%} "
                  f"{run.idle_slots:>6.0%} {run.over_requests:>8.1%} "
                  + (f"{run.over_room:>6.1%}" if harness is simulate_on_engines else f"{'':>6}")
                  + (f"  itl p95 {run.itl_p95 * 1000:.0f} ms" if run.itl_p95 is not None else ""), flush=True)
    physical_table({**GAUGE_LAWS, "ours (utilisation)": ours("utilisation")}, args.smoke)
    physical_field_table(GAUGE_LAWS, args.smoke)
    if args.smoke:
        from control_seeds import print_spread

        print_spread(2, smoke=True)  # the seed table's smoke (its full run is --seeds N alone)
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Control laws on the deterministic harness: ours against the seeds' laws and Netflix AIMD.

    python bench/bench_control.py            # every scenario (a few seconds each)
    python bench/bench_control.py --smoke    # two short scenarios, to prove it runs

Each scenario runs every law on the same seeded harness
(:mod:`lanes.control.simulate`: a hidden capacity over two replicas,
lognormal service times, gauges lagging 1 s, 5 s intervals). Columns:

- settle: decisions until the width is and stays within +-10 % of the
  capacity ("never": it does not settle in the run); after a capacity
  change, counted from that change;
- range: the widths seen over the last half of the (last) phase;
- changes, cuts: width changes and cuts over the whole run;
- recover: decisions from the first cut until the width is back at (or above)
  the width before it ("-": no cut; "never": not in the run);
- over: share of time the lane held more requests than the backend could run;
- idle: share of the capacity left unused while work waited.

Baselines, as written: seed 000 (x0.8 on a current-generation 529, x1.5 when
every slot was used and the raise was earned); seed 002 (capacity-waiting ->
max(floor, running, 0.8 x width); running >= 0.8 x width with nothing
waiting -> +max(1, 25 %)); Netflix AIMD (x0.9 on any drop in the interval,
+1 when in-flight >= width / 2; with gauges a drop is work waiting for
capacity). The floor is the scenario's (1), not seed 002's configured width,
or it could never come down from 10x too high.
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


def ours(kind: str):
    params = normalise({}, kind)
    return lambda s, b, memo: compose({kind: params}, s, b, memo).width


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
    if g is None or not g.ok:
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


GAUGE_LAWS = {"ours (vllm)": ours("vllm"), "seed 002": seed002, "Netflix AIMD": netflix_aimd}
OVERLOAD_LAWS = {"ours (overload)": ours("overload"), "seed 000": seed000, "Netflix AIMD": netflix_aimd}


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
                               60_000, mode="overload", cycles=12, ceiling=200_000, service_s=30.0, replicas=1),
                      OVERLOAD_LAWS, 0))
        found.append((Scenario("slow 529s after one overload event", ((0, 1000), (12.0, 400), (12.5, 1000)), 1000,
                               mode="overload", cycles=12, ceiling=2000, reject_s=3.0), OVERLOAD_LAWS, 0))
        found.append((Scenario("rejects every request", ((0, 0),), 40, mode="overload", cycles=20), OVERLOAD_LAWS, 0))
        util = {"ours (utilisation)": ours("utilisation")}
        found.append((Scenario("load 85 % of capacity, width 85", ((0, 100),), 85, mode="gauges", cycles=40,
                               arrival_rate=85.0), {**util, **GAUGE_LAWS}, 0))
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
    args = parser.parse_args(argv)
    started = time.monotonic()
    print(f"{'scenario':40} {'law':20} {'settle':>7} {'range':>14} {'changes':>7} {'cuts':>5} {'recover':>7} "
          f"{'over':>6} {'idle':>6}")
    for scenario, laws, since in scenarios(args.smoke):
        for name, law in laws.items():
            run = simulate(scenario, law)
            settle = run.cycles_to_settle(since)
            half = since + (len(run.widths) - since) // 2
            low, high = run.range_after(half)
            print(f"{scenario.name:40} {name:20} {settle if settle is not None else 'never':>7} "
                  f"{f'{low}..{high}':>14} {run.changes:>7} {run.cuts:>5} "
                  f"{recovery(run.widths, scenario.start_width):>7} {run.over_admission:>6.0%} "
                  f"{run.idle_slots:>6.0%}", flush=True)
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

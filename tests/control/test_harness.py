"""The laws on the deterministic harness: the issue's quality targets, asserted.

Same seeded runs as bench/bench_control.py, shortened; counts of decisions,
not time, are asserted.
"""

from __future__ import annotations

import pytest

from lanes.catalog.controllers import normalise
from lanes.control.laws import compose
from lanes.control.simulate import Scenario, simulate


def ours(kind: str):
    params = normalise({}, kind)
    return lambda s, b, memo: compose({kind: params}, s, b, memo).width


LAW = {"gauges": ours("vllm"), "overload": ours("overload")}


@pytest.mark.parametrize("mode", ["gauges", "overload"])
@pytest.mark.parametrize("start", [10, 1000])
def test_an_untold_capacity_of_100_is_reached_within_10_decisions_and_kept(mode, start):
    # 529s that take 0.2 s keep the 10x-too-wide first interval cheap to simulate.
    run = simulate(Scenario("c100", ((0, 100),), start, mode=mode, cycles=25, ceiling=2000, reject_s=0.2), LAW[mode])
    settled = run.cycles_to_settle()
    assert settled is not None and settled <= 10, run.widths
    assert all(90 <= w <= 110 for w in run.widths[settled:]), run.widths


@pytest.mark.parametrize("mode", ["gauges", "overload"])
def test_a_capacity_drop_to_20_is_followed_within_5_decisions_and_a_rise_back_within_10(mode):
    scenario = Scenario("steps", ((0, 100), (100.0, 20), (200.0, 100)), 100, mode=mode, cycles=60, floor=5,
                        ceiling=2000)
    run = simulate(scenario, LAW[mode])
    drop = run.cycles_to_settle(19)
    assert drop is not None and drop <= 5, run.widths[19:40]
    assert min(run.widths) >= 5
    back = next(i for i in range(39, 60) if run.widths[i] >= 90) - 39 + 1
    assert back <= 10, run.widths[39:]


def test_a_backend_that_rejects_every_request_never_climbs():
    run = simulate(Scenario("zero", ((0, 0),), 40, mode="overload", cycles=15), LAW["overload"])
    assert all(b <= a for a, b in zip([40, *run.widths], run.widths)) and run.widths[-1] == 1


def test_after_one_overload_a_hosted_width_is_back_within_two_decisions():
    scenario = Scenario("hosted", ((0, 1_000_000), (12.0, 48_000), (13.0, 1_000_000)), 60_000, mode="overload",
                        cycles=6, ceiling=200_000, service_s=30.0, replicas=1)
    run = simulate(scenario, LAW["overload"])
    assert run.cuts == 1
    cut = next(i for i, w in enumerate(run.widths) if i and w < run.widths[i - 1])
    assert next(j for j in range(cut, len(run.widths)) if run.widths[j] >= run.widths[cut - 1]) - cut <= 2


def test_the_harness_is_deterministic():
    scenario = Scenario("c100", ((0, 100),), 10, mode="gauges", cycles=12)
    assert simulate(scenario, LAW["gauges"]).widths == simulate(scenario, LAW["gauges"]).widths

"""The laws on the deterministic harness: the issue's quality targets, asserted.

Same seeded runs as bench/bench_control.py, shortened; counts of decisions,
not time, are asserted.
"""

from __future__ import annotations

import pytest

from lanes.catalog.controllers import normalise
from lanes.control.laws import compose
from lanes.control.simulate import Scenario, simulate


def ours(kind: str, **given):
    params = normalise(given, kind)
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
def test_a_capacity_drop_to_20_is_followed_within_5_decisions_and_a_rise_back_within_one_probe_back_off(mode):
    scenario = Scenario("steps", ((0, 100), (100.0, 20), (200.0, 100)), 100, mode=mode, cycles=60, floor=5,
                        ceiling=2000)
    run = simulate(scenario, LAW[mode])
    drop = run.cycles_to_settle(19)
    assert drop is not None and drop <= 5, run.widths[19:40]
    assert min(run.widths) >= 5
    # Probes at 20 that kept failing have backed off (8, then 16 decisions): the rise is
    # found at the next probe, then growth is fast again.
    back = next(i for i in range(39, 60) if run.widths[i] >= 90) - 39 + 1
    assert back <= 20, run.widths[39:]


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


FIELD = dict(mode="gauges", ceiling=2000, lag_range=(3.0, 6.0), scrape_s=12.0, kv_at_full=0.5)


def test_the_harness_kv_gauge_is_token_accounting():
    # max_num_seqs (the largest capacity, 100) binds first: the cache is half full at a full
    # batch. Long contexts cut the capacity to 60: the cache binds, full at 60 running.
    seen = []

    def watch(s, b, memo):
        if s.gauges is not None and s.gauges.ok:
            seen.append((s.gauges.running, s.gauges.kv_usage))
        return s.width

    simulate(Scenario("kv", ((0, 100), (60.0, 60)), 100, mode="gauges", cycles=24, kv_at_full=0.5), watch)
    assert seen[2] == (100, 0.5)
    assert seen[-1] == (60, 1.0)


@pytest.mark.parametrize("capacity,start,replicas", [(100, 10, 2), (2, 2, 1)])
def test_in_the_field_an_untold_capacity_is_settled_within_10_decisions(capacity, start, replicas):
    # Gauges 3-6 s old, a reading every third decision, max_num_seqs binding before the cache.
    run = simulate(Scenario("field", ((0, capacity),), start, cycles=80, replicas=replicas, **FIELD), LAW["gauges"])
    settled = run.cycles_to_settle()
    assert settled is not None and settled <= 10, run.widths
    assert run.idle_slots <= 0.10
    assert run.over_requests <= 0.06


def test_the_harness_reports_call_time_as_the_lane_sees_it_wait_in_vllm_included():
    # 200 admitted against 100 slots: half wait in vLLM. The lane's call-seconds (admission to
    # answer, as the walkers report them) hold about 200 at once, not the 100 that run.
    seen = []

    def watch(s, b, memo):
        if s.served_concurrency is not None and s.window_seconds:
            seen.append(s.served_concurrency)
        return s.width

    simulate(Scenario("wait", ((0, 100),), 200, mode="gauges", cycles=8), watch)
    assert min(seen[2:]) > 180


@pytest.mark.parametrize("fail", [0.0, 0.2])
def test_in_the_field_the_excursion_past_an_untold_cap_ends_on_the_lanes_answers(fail):
    # From 100 with room in the cache for twice that: the growth past the cap ends two decisions
    # later, failed scrape or not (it lasted until a reading judged it: 15 s, 30 s when that
    # scrape failed). The answers of its own interval are as many as the 100 before it ran, of
    # calls begun before it: the reading the law asks for at once, or the next interval's
    # answers, judge it.
    run = simulate(Scenario("field", ((0, 100),), 100, cycles=80, scrape_fail=fail, **FIELD), LAW["gauges"])
    assert run.widths[2] <= 100, run.widths[:8]
    assert run.over_requests <= 0.06


@pytest.mark.parametrize("fail", [0.1, 0.2])
def test_in_the_field_a_probe_above_the_running_cap_ends_on_the_lanes_answers(fail):
    # F2 / F3: one probe above the running cap in the run (105 over 100). The lane's answers
    # fail it within two decisions; a reading came 15 s later, or 30 s when its scrape failed,
    # and every request admitted meanwhile waited in vLLM (5.2 % of the run's requests).
    # The harness's call time does not grow with the batch: the judgment is on (off by default).
    judged = ours("vllm", lane_probe=0.03)
    run = simulate(Scenario("field", ((0, 100),), 100, cycles=80, scrape_fail=fail, **FIELD), judged)
    probes = [i for i in range(1, len(run.widths)) if run.widths[i] > 100 and run.widths[i - 1] == 100]
    assert probes, run.widths
    for i in probes:
        assert run.widths[i + 2] == 100, run.widths[i - 1:i + 4]
    assert run.over_requests <= 0.05


def test_in_the_field_a_burst_under_a_load_below_the_width_is_not_taken_for_work_waiting_in_vllm():
    # F9: a Poisson load of 85 on capacity 100. A burst fills the lane of 100 just before a
    # decision while the interval's answers show 83 run at once; the decision before, 69 were
    # in flight. Nothing waited in vLLM: the width stays at the capacity.
    run = simulate(Scenario("load 85", ((0, 100),), 85, cycles=80, arrival_rate=85.0, **FIELD), LAW["gauges"])
    settled = run.cycles_to_settle()
    assert settled is not None and settled <= 10, run.widths
    assert run.range_after(40)[0] >= 90, run.widths  # was 83 from decision 28 on
    assert run.idle_slots <= 0.02, run.idle_slots  # was 11 %
    assert run.over_requests <= 0.05


def test_in_the_field_a_drop_is_looked_at_twice_by_the_lanes_answers():
    # F6: the capacity halves every other 40 s. The lane's first estimate after a drop reads high
    # (the batch above the new capacity is still finishing in its interval); its second look,
    # a decision later, goes the rest of the way when no reading has.
    swing = tuple((t * 40.0, 100 if t % 2 == 0 else 50) for t in range(11))
    run = simulate(Scenario("swing", swing, 100, cycles=80, **FIELD), LAW["gauges"])
    one_look = normalise({"lane_rejudge": 0}, "vllm")
    once = simulate(Scenario("swing", swing, 100, cycles=80, **FIELD),
                    lambda s, b, memo: compose({"vllm": one_look}, s, b, memo).width)
    # 13.1 against 14.0 % of requests over (11.2 % with one look when a cap the lane measured in
    # the interval of a growth kept its whole back-off, and the pool sat at 50 in every rise).
    assert run.over_requests <= once.over_requests - 0.005 and run.over_requests <= 0.135, (
        run.over_requests, once.over_requests)

"""The `vllm` law in front of the simulator's physical engines (bench/control_physical.py):
decode steps that slow as the batch grows, ``max_num_seqs`` and the KV cache as limits."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from control_physical import PhysicalScenario, simulate_physical  # noqa: E402

from lanes.catalog.controllers import normalise  # noqa: E402
from lanes.control.laws import compose  # noqa: E402

VLLM = {"vllm": normalise({}, "vllm")}


def law(s, b, memo):
    return compose(VLLM, s, b, memo).width


def test_slower_calls_in_a_wider_batch_are_not_taken_for_work_waiting_and_the_width_reaches_the_engines_bound():
    # Two engines of max_num_seqs 256, a reading every decision. Calls at 64 running take about
    # 1.5 x those at 8; read against the yardstick taken at 8, the lane's answers "showed" 25
    # run at once and the width swung 22 <-> 64 (before the same decision's reading, which saw
    # 64 run and none wait, overruled them).
    run = simulate_physical(PhysicalScenario("physical", cycles=24), law)
    assert max(run.widths) >= 460 and min(run.widths[-3:]) >= 460, run.widths
    assert max(run.running[-3:]) >= 460, run.running
    # At 512 the calls take several times the yardstick taken at 8: read against it, 496
    # running "showed" 71 run at once, and cut after cut walked the pool down to 459 before a
    # probe took it back. A reading that saw far more running than that drops the yardstick.
    # (The last half holds within 10 % of the bound: the requests admitted together here answer
    # together, and a wave's prompts read as 470 running and 2 waiting at 488 stand as a cap of
    # 486 once the width goes back from a first cap outrun while the lane drained it.)
    assert min(run.widths[len(run.widths) // 2:]) >= 0.9 * 512, run.widths


def test_in_the_field_a_first_cap_read_during_a_burst_is_probed_again_and_the_width_reaches_the_engines_bound():
    # The field's cadence: a scrape at most every 12 s, 3-6 s old. After the growth to 512 the
    # first saturated reading shows 146 running while the admitted prompts wait for the step's
    # token budget (before, from 711, 446); kept as the running cap for its back-off, such a
    # reading held the pool there for the whole run. (The lane draining a cut is not judged by
    # its answers: test_laws.py.)
    run = simulate_physical(PhysicalScenario("field", cycles=30, scrape_s=12.0, lag_range=(3.0, 6.0)), law)
    first_full = run.widths.index(512)
    assert run.widths[first_full + 1] < 0.5 * 512, run.widths
    assert min(run.widths[-5:]) >= 490 and max(run.running[-5:]) >= 490, (run.widths, run.running)


# --- the benchmark's scenarios in front of the engines (bench/control_engines.py) ----------------

from control_engines import simulate_on_engines  # noqa: E402

from dataclasses import replace  # noqa: E402

from lanes.control.simulate import Scenario, simulate  # noqa: E402


def fixed(width):
    return lambda s, b, memo: width


def test_on_the_engines_a_wider_batch_slows_every_call_which_the_hidden_harness_does_not():
    sc = Scenario("C=100", ((0, 100),), 10, mode="gauges", cycles=8, ceiling=2000)
    wide_sc = replace(sc, start_width=100)
    narrow, wide = simulate_on_engines(sc, fixed(10)), simulate_on_engines(wide_sc, fixed(100))
    assert wide.itl_p95 > 2 * narrow.itl_p95, (narrow.itl_p95, wide.itl_p95)
    # Little's law: 10x the width serves well under 10x the answers (each call is slower).
    assert narrow.served * 2 < wide.served < narrow.served * 8, (narrow.served, wide.served)
    hidden_narrow, hidden_wide = simulate(sc, fixed(10)), simulate(wide_sc, fixed(100))
    assert hidden_wide.served > hidden_narrow.served * 9.5


def test_on_the_engines_a_width_above_the_capacity_waits_in_vllm_and_counts_as_over_admission():
    sc = Scenario("C=100", ((0, 100),), 150, mode="gauges", cycles=8, ceiling=2000)
    over = simulate_on_engines(sc, fixed(150))
    at = simulate_on_engines(replace(sc, start_width=90), fixed(90))
    assert over.over_requests > 0.25 and over.over_admission > 0.9, (over.over_requests, over.over_admission)
    # At the width, only the first burst waits (90 prompts at once queue for the step's token budget).
    assert at.over_admission == 0.0 and at.over_requests < over.over_requests / 4, (at.over_requests,
                                                                                     over.over_requests)


def test_on_the_engines_a_lower_capacity_is_the_kv_cache_binding_and_the_gateway_answers_529_past_it():
    binding = Scenario("C 100 -> 50", ((0, 100), (20.0, 50)), 100, mode="gauges", cycles=8, ceiling=2000)
    run = simulate_on_engines(binding, fixed(100))
    assert run.over_requests > 0.2  # preempted or left waiting once the cache holds 50
    gateway = Scenario("C=50 gateway", ((0, 50),), 80, mode="overload", cycles=4, ceiling=2000)
    rejected = simulate_on_engines(gateway, fixed(80))
    assert rejected.rejected > 0 and rejected.served > 0


def test_on_the_engines_the_same_scenario_gives_the_same_run():
    sc = Scenario("F", ((0, 100),), 10, mode="gauges", cycles=10, ceiling=2000, lag_range=(3.0, 6.0),
                  scrape_s=12.0, kv_at_full=0.5)
    first, second = simulate_on_engines(sc, law), simulate_on_engines(sc, law)
    assert first.widths == second.widths and first.waited == second.waited


def test_on_the_engines_a_growth_a_fresh_reading_saw_run_is_not_undone_by_slower_calls():
    # From 10 to 40: the new calls share decode steps with each other's prefills, so they take
    # longer than the yardstick taken at 10. A reading after the growth saw 39 run with none
    # waiting; the lane's answers once cut anyway ("about 23 run at once") and kept 37 as a cap.
    run = simulate_on_engines(Scenario("C=100 from 10", ((0, 100),), 10, mode="gauges", cycles=12,
                                       ceiling=2000), law)
    assert run.cycles_to_settle(0) <= 5, run.widths
    assert min(run.widths[1:]) >= 40, run.widths


def test_on_the_engines_a_start_burst_waiting_for_the_token_budget_does_not_hold_the_pool_below_capacity():
    # 100 admitted at once wait for the step's token budget; the first reading (3-6 s old) shows
    # 86 running and work waiting. Taken for max_num_seqs, that held the pool at 86 for 70 decisions.
    sc = Scenario("F start at capacity", ((0, 100),), 100, mode="gauges", cycles=24, ceiling=2000,
                  lag_range=(3.0, 6.0), scrape_s=12.0, kv_at_full=0.5, gauge_noise=0.10)
    run = simulate_on_engines(sc, law)
    assert min(run.widths[14:]) >= 90, run.widths  # within 10 % of the capacity (gauges 10 % noisy)


def test_on_the_engines_after_a_long_context_burst_the_width_goes_back_up_within_a_few_readings():
    # F12: long prompts fill the KV cache (capacity 100 -> 60 for 30 s). On the way back up, the
    # lane's answers in the growth's first interval read 63 of 100 running; kept as a cap for its
    # whole back-off (24 readings), it held the pool at 62 to the end of the run (idle 27 %).
    sc = Scenario("F12", ((0, 100), (150.0, 60), (180.0, 100)), 100, mode="gauges", cycles=80, ceiling=2000,
                  lag_range=(3.0, 6.0), scrape_s=12.0, kv_at_full=0.5)
    run = simulate_on_engines(sc, law)
    after = run.widths[60:]  # from 120 s after the burst ended
    assert sum(after) / len(after) >= 75 and max(after) >= 80, run.widths


def test_the_benchmarks_oracle_follows_the_capacity_and_a_swing_every_20_s_costs_it_more_than_5_percent():
    # bench_control's oracle row: the capacity the scenario has at each decision, which no law can
    # read. What it still costs is the scenario's: on F5's swing the batch above each drop waits.
    from bench_control import oracle

    swing = tuple((t * 20.0, 100 if t % 2 == 0 else 50) for t in range(6))
    sc = Scenario("swing", swing, 100, mode="gauges", cycles=24, ceiling=2000, lag_range=(3.0, 6.0),
                  scrape_s=12.0, kv_at_full=0.5)
    run = simulate_on_engines(sc, oracle(sc))
    assert run.widths == [sc.capacity_at((i + 1) * sc.interval_s) for i in range(len(run.widths))], run.widths
    steady = replace(sc, capacity=((0, 100),))
    at_capacity = simulate_on_engines(steady, oracle(steady)).over_requests  # the first prompts' burst
    assert run.over_requests > 0.05 and run.over_requests > 2 * at_capacity, (run.over_requests, at_capacity)


def test_the_late_oracles_learn_each_change_decisions_after_it_and_a_swing_costs_them_more():
    # A law that reads gauges learns a change of capacity no sooner than a reading taken after
    # it: the late oracles are what knowing the capacity that late still costs, the bound any
    # such law is judged against on the swings.
    from bench_control import oracles

    swing = tuple((t * 20.0, 100 if t % 2 == 0 else 50) for t in range(6))
    sc = Scenario("swing", swing, 100, mode="gauges", cycles=24, ceiling=2000, lag_range=(3.0, 6.0),
                  scrape_s=12.0, kv_at_full=0.5)
    rows = oracles(sc)
    assert list(rows) == ["oracle", "oracle +1 decision", "oracle +2 decisions"]
    runs = {name: simulate_on_engines(sc, law) for name, law in rows.items()}
    for name, late in (("oracle +1 decision", 1), ("oracle +2 decisions", 2)):
        expected = [sc.capacity_at(max(0, i + 1 - late) * sc.interval_s) for i in range(len(runs[name].widths))]
        assert runs[name].widths == expected, (name, runs[name].widths)
    over = [runs[name].over_requests for name in rows]
    assert over[0] < over[1] < over[2], over
    # A capacity that never changes has no late rows: the oracle on time is its only bound.
    assert list(oracles(replace(sc, capacity=((0, 100),)))) == ["oracle"]

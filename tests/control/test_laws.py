"""Each rule of the control laws, on hand-made signals (seeds 000, 001 and 002's tests)."""

from __future__ import annotations

from lanes.catalog.controllers import normalise
from lanes.control.laws import Bounds, Gauges, Signals, compose, overload_law, utilisation_law, vllm_law

OVERLOAD = normalise({}, "overload")
VLLM = normalise({}, "vllm")
UTIL = normalise({"min_intervals": 1}, "utilisation")
WIDE = Bounds(1, 100_000)


def full(width: int, **more) -> Signals:
    """Every slot in use, work waiting, the raise earned many times over."""
    return Signals(width=width, in_flight=width, waiting=10, admitted=10 * width, **more)


# --- overload (seed 000) -------------------------------------------------------------


def test_one_overload_without_a_measurement_cuts_100_to_80():
    assert overload_law(full(100, overloads=1), WIDE, OVERLOAD, {}).width == 80


def test_sustained_overload_walks_down_80_to_64():
    memo = {}
    assert overload_law(full(100, overloads=3), WIDE, OVERLOAD, memo).width == 80
    assert overload_law(full(80, overloads=2), WIDE, OVERLOAD, memo).width == 64


def test_an_overload_cuts_to_what_the_backend_served_at_once():
    proposal = overload_law(full(150, overloads=40, served_concurrency=101.7), WIDE, OVERLOAD, {})
    assert proposal.width == 101 and proposal.decision == "cut"


def test_small_widths_still_make_progress_downward_and_never_reach_zero():
    memo, width = {}, 3
    for _ in range(5):
        width = overload_law(full(width, overloads=1), WIDE, OVERLOAD, memo).width
    assert width == 1


def test_the_width_starts_at_the_configured_value_and_can_grow_past_it():
    proposal = overload_law(full(10), Bounds(1, 512), OVERLOAD, {})
    assert proposal.width == 15 and proposal.decision == "grow"


def test_a_raise_must_be_earned_by_as_many_admissions_as_it_adds():
    s = Signals(width=10, in_flight=10, waiting=5, admitted=4)
    assert overload_law(s, WIDE, OVERLOAD, {}).decision == "hold"
    s = Signals(width=10, in_flight=10, waiting=5, admitted=5)
    assert overload_law(s, WIDE, OVERLOAD, {}).width == 15


def test_a_width_whose_slots_were_not_all_used_does_not_grow():
    s = Signals(width=10, in_flight=7, waiting=0, admitted=500)
    assert overload_law(s, WIDE, OVERLOAD, {}).decision == "hold"


def test_a_backend_that_rejects_everything_never_climbs():
    memo, width = {}, 40
    for _ in range(30):
        proposal = overload_law(full(width, overloads=5, served_concurrency=0.0), WIDE, OVERLOAD, memo)
        assert proposal.width <= width
        width = proposal.width
    assert width == 1


def test_recovery_from_one_cut_at_60000_takes_one_growth():
    memo = {}
    cut = overload_law(full(60_000, overloads=1), WIDE, OVERLOAD, memo).width
    assert cut == 48_000
    assert overload_law(full(cut), WIDE, OVERLOAD, memo).width >= 60_000


def test_near_a_measured_capacity_the_width_probes_by_five_percent_then_grows_fast_once_a_probe_holds():
    memo = {}
    assert overload_law(full(150, overloads=9, served_concurrency=100.0), WIDE, OVERLOAD, memo).width == 100
    assert overload_law(full(100), WIDE, OVERLOAD, memo).width == 105  # the probe
    # The probe failed: back to the measured capacity.
    assert overload_law(full(105, overloads=2, served_concurrency=100.0), WIDE, OVERLOAD, memo).width == 100
    assert overload_law(full(100), WIDE, OVERLOAD, memo).width == 105
    # The backend grew: the probe at the width that failed before holds, growth is fast again.
    assert overload_law(full(105), WIDE, OVERLOAD, memo).width == 158


# --- vllm (seed 002) -------------------------------------------------------------------


def gauges(running, waiting=0, capacity=0.0, kv=0.5, ok=True):
    return Gauges(ok=ok, running=running, waiting=waiting, waiting_capacity=capacity, kv_usage=kv)


def test_saturation_cuts_to_the_running_count_never_below_the_floor():
    s = Signals(width=40, in_flight=40, waiting=0, gauges=gauges(30, waiting=10, capacity=10))
    assert vllm_law(s, Bounds(1, 512), VLLM, {}).width == 30
    assert vllm_law(s, Bounds(35, 512), VLLM, {}).width == 35


def test_a_saturation_cut_keeps_at_least_half_the_width():
    s = Signals(width=1000, in_flight=1000, waiting=0, gauges=gauges(100, waiting=900, capacity=900))
    assert vllm_law(s, Bounds(1, 2000), VLLM, {}).width == 500


def test_near_full_grows_and_a_low_load_holds():
    grow = Signals(width=10, in_flight=10, waiting=0, gauges=gauges(9))
    assert vllm_law(grow, Bounds(1, 512), VLLM, {}).width == 15
    low = Signals(width=10, in_flight=5, waiting=0, gauges=gauges(5))
    assert vllm_law(low, Bounds(1, 512), VLLM, {}).decision == "hold"


def test_gauges_that_still_show_a_burst_the_lane_has_finished_never_grow_it():
    # The scrape lags dispatch: 9 of 10 running a moment ago, nothing in flight now.
    lagging = Signals(width=10, in_flight=0, waiting=0, gauges=gauges(9))
    assert vllm_law(lagging, Bounds(1, 512), VLLM, {}).decision == "hold"


def test_without_the_capacity_gauge_waiting_above_the_threshold_or_a_full_kv_cache_is_saturation():
    legacy = Gauges(ok=True, running=8, waiting=3, waiting_capacity=None, kv_usage=0.7)
    assert vllm_law(Signals(width=12, in_flight=12, waiting=0, gauges=legacy), WIDE, VLLM, {}).width == 8
    full_cache = Gauges(ok=True, running=9, waiting=0, waiting_capacity=0, kv_usage=0.99)
    assert vllm_law(Signals(width=12, in_flight=12, waiting=0, gauges=full_cache), WIDE, VLLM, {}).width == 9


def test_a_failed_scrape_never_grows_and_falls_back_to_the_floor():
    s = Signals(width=40, in_flight=40, waiting=5, gauges=Gauges(ok=False, error="connection refused"))
    proposal = vllm_law(s, Bounds(4, 512), VLLM, {})
    assert proposal.width == 4 and proposal.decision == "floor"


def test_no_new_scrape_holds():
    assert vllm_law(Signals(width=7, in_flight=7, waiting=3), WIDE, VLLM, {}).decision == "hold"


# --- utilisation (seed 001) ------------------------------------------------------------


def util(width, in_flight, kv, completions=25):
    return Signals(width=width, in_flight=in_flight, waiting=0, completions=completions,
                   gauges=Gauges(ok=True, running=in_flight, kv_usage=kv))


def test_utilisation_within_tolerance_changes_nothing():
    assert utilisation_law(util(20, 20, 0.87), WIDE, UTIL, {}).decision == "hold"


def test_over_utilised_cuts_to_in_flight_times_target_over_utilisation():
    assert utilisation_law(util(20, 20, 1.0), WIDE, UTIL, {}).width == 17


def test_a_rise_is_capped_at_twice_the_width_and_needs_used_slots():
    assert utilisation_law(util(10, 10, 0.2), WIDE, UTIL, {}).width == 20
    assert utilisation_law(util(10, 4, 0.2), WIDE, UTIL, {}).decision == "hold"


def test_a_decision_waits_for_enough_completions_and_idle_intervals_do_not_count():
    memo = {}
    assert "gathering" in utilisation_law(util(20, 20, 1.0, completions=10), WIDE, UTIL, memo).reason
    idle = Signals(width=20, in_flight=0, waiting=0, completions=0, gauges=Gauges(ok=True, kv_usage=0.0))
    assert "idle" in utilisation_law(idle, WIDE, UTIL, memo).reason
    assert utilisation_law(util(20, 20, 1.0, completions=10), WIDE, UTIL, memo).width == 17


def test_by_default_a_decision_needs_six_busy_intervals_of_gauges():
    params, memo = normalise({}, "utilisation"), {}
    for _ in range(5):
        assert utilisation_law(util(20, 20, 1.0), WIDE, params, memo).decision == "hold"
    assert utilisation_law(util(20, 20, 1.0), WIDE, params, memo).width == 17


def test_a_window_that_saw_a_width_change_moves_nothing():
    memo = {}
    utilisation_law(util(20, 20, 1.0, completions=10), WIDE, UTIL, memo)
    proposal = utilisation_law(util(24, 24, 1.0, completions=30), WIDE, UTIL, memo)
    assert proposal.decision == "hold" and "changed" in proposal.reason


# --- composition ---------------------------------------------------------------------


def test_the_lowest_proposal_wins_and_names_its_controller():
    s = Signals(width=100, in_flight=100, waiting=5, admitted=1000, overloads=1,
                gauges=gauges(100))
    composed = compose({"overload": OVERLOAD, "vllm": VLLM}, s, WIDE, {})
    assert composed.width == 80 and composed.controller == "overload"
    assert set(composed.proposals) == {"overload", "vllm"}


def test_a_growth_needs_every_controller_to_agree():
    s = Signals(width=10, in_flight=10, waiting=5, admitted=3, gauges=gauges(10, kv=0.9))
    composed = compose({"overload": OVERLOAD, "vllm": VLLM}, s, WIDE, {})
    assert composed.width == 10 and composed.decision == "hold"

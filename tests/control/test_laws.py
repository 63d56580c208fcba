"""Each rule of the control laws, on hand-made signals (seeds 000, 001 and 002's tests)."""

from __future__ import annotations

from dataclasses import replace

from lanes.catalog.controllers import normalise
from lanes.control.laws import (Bounds, Gauges, Signals, _lane_evidence, compose, overload_law, utilisation_law,
                                vllm_law, wants_reading)

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
    memo, quick = {}, {**OVERLOAD, "probe_backoff": 2}
    assert overload_law(full(150, overloads=9, served_concurrency=100.0), WIDE, quick, memo).width == 100
    assert overload_law(full(100), WIDE, quick, memo).width == 105  # the probe, after a short pause
    # The probe failed: back to the measured capacity, and no probe for 2 decisions.
    assert overload_law(full(105, overloads=2, served_concurrency=100.0), WIDE, quick, memo).width == 100
    assert [overload_law(full(100), WIDE, quick, memo).decision for _ in range(2)] == ["hold", "grow"]
    # The backend grew: the probe at the width that failed before holds, growth is fast again.
    assert overload_law(full(105), WIDE, quick, memo).width == 158


def test_probes_that_keep_failing_wait_longer_and_longer():
    memo, gaps = {}, []
    width, since = 150, 0
    for _ in range(400):
        if width > 100:  # every probe above 100 fails
            width = overload_law(full(width, overloads=1, served_concurrency=100.0), WIDE, OVERLOAD, memo).width
            gaps.append(since)
            since = 0
        else:
            width = overload_law(full(width), WIDE, OVERLOAD, memo).width
            since += 1
    gaps = gaps[1:]  # decisions at the measured capacity between two cuts (the first cut found it)
    assert len(gaps) >= 4 and all(later >= earlier for earlier, later in zip(gaps, gaps[1:])), gaps
    assert gaps[:6] == [1, 8, 16, 32, 64, 128]  # a short pause, then doubling up to max_probe_backoff
    assert gaps[-1] >= 64


def test_at_small_widths_a_probe_of_one_waits_in_proportion_to_its_size():
    def decisions_until_a_probe(capacity, memo):
        for n in range(1, 100_000):
            proposal = overload_law(full(capacity), WIDE, OVERLOAD, memo)
            if proposal.decision == "grow":
                return n, proposal.width

    def first_probe_after_a_failure(capacity):
        memo = {}
        overload_law(full(capacity * 2, overloads=1, served_concurrency=float(capacity)), WIDE, OVERLOAD, memo)
        _, probe = decisions_until_a_probe(capacity, memo)
        overload_law(full(probe, overloads=1, served_concurrency=float(capacity)), WIDE, OVERLOAD, memo)
        return decisions_until_a_probe(capacity, memo)[0]

    # +1 at 2 is +50 %: ten times the share a 5 % probe at 100 takes, so ten times the wait.
    assert first_probe_after_a_failure(2) >= 10 * first_probe_after_a_failure(100) - 1
    assert first_probe_after_a_failure(1) > first_probe_after_a_failure(2)


# --- vllm (seed 002) -------------------------------------------------------------------


def gauges(running, waiting=0, capacity=0.0, kv=0.5, ok=True):
    return Gauges(ok=ok, running=running, waiting=waiting, waiting_capacity=capacity, kv_usage=kv)


def test_saturation_cuts_to_the_running_count_never_below_the_floor():
    s = Signals(width=40, in_flight=40, waiting=0, gauges=gauges(30, waiting=10, capacity=10))
    assert vllm_law(s, Bounds(1, 512), VLLM, {}).width == 30
    assert vllm_law(s, Bounds(35, 512), VLLM, {}).width == 35


def test_a_saturation_cut_keeps_at_least_half_the_width_when_the_cache_binds():
    # A full KV cache (or no KV gauge): the running count may be a moment of a changing mix.
    for kv in (0.99, None):
        s = Signals(width=1000, in_flight=1000, waiting=0, gauges=gauges(100, waiting=900, capacity=900, kv=kv))
        assert vllm_law(s, Bounds(1, 2000), VLLM, {}).width == 500


def test_work_waiting_with_room_in_the_cache_cuts_at_once_to_the_running_cap():
    # max_num_seqs binds: however old the reading, the backend was full then, and ran 100.
    memo = {}
    s = Signals(width=1000, in_flight=1000, waiting=0, gauges=gauges(100, waiting=900, capacity=900, kv=0.5))
    proposal = vllm_law(s, Bounds(1, 2000), VLLM, memo)
    assert proposal.width == 100 and "running cap 100" in proposal.reason
    assert memo["cap"] == 100


def test_a_running_gauge_read_low_is_not_taken_for_a_lower_cap():
    # 101 in flight, 1 waiting in vLLM: the cap is 100, though a noisy gauge says 85 run.
    memo = {}
    s = Signals(width=101, in_flight=101, waiting=50, gauges=gauges(85, waiting=1, capacity=1, kv=0.45))
    assert vllm_law(s, WIDE, VLLM, memo).width == 100 and memo["cap"] == 100


def test_a_request_in_transit_is_not_taken_for_a_higher_cap():
    # 105 in flight, 4 waiting in vLLM, 100 running: the one the lane counts over the gauge is in
    # transit (answered, not yet counted). Cut to 100, not 101, where all admitted work waits.
    memo = {}
    s = Signals(width=105, in_flight=105, waiting=50, gauges=gauges(100, waiting=4, capacity=4, kv=0.47))
    assert vllm_law(s, WIDE, VLLM, memo).width == 100 and memo["cap"] == 100
    # At 512 running, ten in transit is 2 %: still the gauge.
    memo = {}
    s = Signals(width=600, in_flight=600, waiting=50, gauges=gauges(512, waiting=78, capacity=78, kv=0.6))
    assert vllm_law(s, WIDE, VLLM, memo).width == 512


def test_near_full_grows_into_the_room_the_kv_cache_measures_and_a_low_load_holds():
    # 9 running fill 50 % of the cache: 17 fit below the 98 % threshold.
    grow = Signals(width=10, in_flight=10, waiting=30, gauges=gauges(9))
    assert vllm_law(grow, Bounds(1, 512), VLLM, {}).width == 17
    # No KV gauge: the blind step (x1.5).
    blind = Signals(width=10, in_flight=10, waiting=30, gauges=gauges(9, kv=None))
    assert vllm_law(blind, Bounds(1, 512), VLLM, {}).width == 15
    low = Signals(width=10, in_flight=5, waiting=0, gauges=gauges(5))
    assert vllm_law(low, Bounds(1, 512), VLLM, {}).decision == "hold"


def test_growth_into_the_room_is_bounded_by_its_factor_the_work_waiting_and_the_running_cap():
    room = gauges(10, kv=0.05)  # room for 196
    assert vllm_law(Signals(width=10, in_flight=10, waiting=1000, gauges=room), WIDE, VLLM, {}).width == 40
    assert vllm_law(Signals(width=10, in_flight=10, waiting=5, gauges=room), WIDE, VLLM, {}).width == 15
    capped = {"cap": 25, "cap_endpoints": 1}
    assert vllm_law(Signals(width=10, in_flight=10, waiting=1000, gauges=room), WIDE, VLLM, capped).width == 25
    # A cache with no room for more than the width: no growth, whatever waits.
    full = vllm_law(Signals(width=10, in_flight=10, waiting=1000, gauges=gauges(10, kv=0.9)), WIDE, VLLM, {})
    assert full.decision == "hold" and "room for 10" in full.reason


def test_at_a_running_cap_a_probe_waits_cap_backoff_readings_and_a_cut_by_the_cache_does_not_shorten_it():
    # The cap is kept for its back-off once two measurements agree (the first waits one reading).
    memo = {}
    near = Signals(width=100, in_flight=100, waiting=50, gauges=gauges(100, kv=0.5))
    first = vllm_law(Signals(width=160, in_flight=160, waiting=50, gauges=gauges(100, 60, 60)), WIDE, VLLM, memo)
    assert first.width == 100 and "to be confirmed" in first.reason
    # One reading can show a prefill backlog, not max_num_seqs: the cap is probed once more...
    probe = vllm_law(near, WIDE, VLLM, memo)
    assert probe.width == 105 and "probe above the running cap 100" in probe.reason
    # ...and a second measurement that agrees starts the back-off.
    confirmed = vllm_law(Signals(width=105, in_flight=105, waiting=50, gauges=gauges(100, 5, 5)), WIDE, VLLM, memo)
    assert confirmed.width == 100 and "running cap 100" in confirmed.reason and "confirmed" not in confirmed.reason
    holds = 0
    while vllm_law(near, WIDE, VLLM, memo).decision == "hold":
        holds += 1
        if holds == 5:  # long contexts fill the cache at 60, then the mix is short again
            cut = vllm_law(Signals(width=100, in_flight=100, waiting=50, gauges=gauges(60, 40, 40, kv=1.0)),
                           WIDE, VLLM, memo)
            assert cut.width == 58  # a share below the 60 at the cache's edge
            back = vllm_law(Signals(width=58, in_flight=58, waiting=50, gauges=gauges(58, kv=0.3)), WIDE, VLLM, memo)
            assert back.width == 100 and "running cap 100" in back.reason  # the room, up to the cap
        assert holds < 100
    assert holds == VLLM["cap_backoff"] - 3  # the two readings of the cache episode count too
    # That probe fails: the next one waits twice as long.
    vllm_law(Signals(width=105, in_flight=105, waiting=50, gauges=gauges(100, 5, 5)), WIDE, VLLM, memo)
    again = 0
    while vllm_law(near, WIDE, VLLM, memo).decision == "hold":
        again += 1
        assert again < 1000
    assert again == 2 * VLLM["cap_backoff"] - 1


def test_a_first_cap_read_during_a_prefill_backlog_is_probed_again_at_the_next_reading_not_kept():
    # 100 admitted at once wait for the step's token budget: one reading shows 86 running and 14
    # waiting with the cache at 35 %. Kept for cap_backoff readings, it held the pool at 86 of 100
    # for 70 decisions; now the next reading probes above it, and the probe that runs more forgets it.
    memo = {}
    cut = vllm_law(Signals(width=100, in_flight=100, waiting=50, gauges=gauges(86, 14, 14, kv=0.35)), WIDE, VLLM,
                   memo)
    assert cut.width == 86 and "to be confirmed" in cut.reason
    probe = vllm_law(Signals(width=86, in_flight=86, waiting=50, gauges=gauges(86, kv=0.4)), WIDE, VLLM, memo)
    assert probe.width > 86 and "probe above the running cap 86" in probe.reason
    # The probe that runs more forgets it: growth goes by the KV room again.
    ran = vllm_law(Signals(width=probe.width, in_flight=probe.width, waiting=50, gauges=gauges(probe.width, kv=0.4)),
                   WIDE, VLLM, memo)
    assert ran.width > probe.width and "cap" not in memo


def test_a_probe_that_fails_at_the_cap_is_not_raised_by_requests_in_transit():
    # Cap 512. The probe at 538 reads 512 running and 10 waiting; the lane's count (538 - 10 = 528)
    # holds 16 answers in transit. Taken for a cap of 528, it left 16 waiting in every reading.
    memo = {"cap": 512, "cap_endpoints": 1, "measured": 512, "failed": 600}
    cut = vllm_law(Signals(width=538, in_flight=538, waiting=1000, width_age_seconds=30.0,
                           gauges=gauges(512, 10, 10, kv=0.72)), WIDE, VLLM, memo)
    assert cut.width == 512 and memo["cap"] == 512


def test_a_running_gauge_read_high_is_not_taken_for_a_higher_cap_once_the_lane_holds_its_width():
    # Capacity 100, gauges with 10 % noise. At a width of 106, all in flight, 6 wait in vLLM, the
    # gauge reads 4 waiting and 112 running: by the lane's count at most 102 can run, and that
    # count is high by the requests in transit (2 %: 2.04, and a request is whole). Read as 112
    # ("at or above the width"), the pool stayed at 106 with work waiting in every reading; read
    # as 102, a cap of 102 stood and every request admitted waited until the readings brought it
    # down one at a time.
    def reading(memo, running, waiting, in_flight_before=106):
        vllm_law(Signals(width=106, in_flight=in_flight_before, waiting=50, gauges=None, width_age_seconds=25.0),
                 WIDE, VLLM, memo)
        return vllm_law(Signals(width=106, in_flight=106, waiting=50, width_age_seconds=30.0,
                                gauges=gauges(running, waiting, waiting, kv=0.44)), WIDE, VLLM, memo)

    memo = {}
    assert reading(memo, 112, 4).width == 99 and memo["cap"] == 99
    # So with the cap known: a gauge that happens to read it (106) is no more exact than another.
    memo = {"cap": 106, "cap_endpoints": 1}
    assert reading(memo, 106, 3).width == 100
    # While the lane drains a cut (more in flight than the width a decision ago), the gauge read
    # seconds before still saw the wider batch run: it stands.
    memo = {}
    assert reading(memo, 112, 4, in_flight_before=180).decision == "hold"


def test_a_cut_to_the_running_cap_that_queues_again_goes_below_the_lanes_count():
    # Capacity 100, gauges with 10 % noise. At 109 the reading shows 94 running and 6 waiting
    # (9 wait): the lane's count, 103, is the cap. At 103 the next reading shows 1 waiting (3 do):
    # the count the cut came by was high. Cut at the lane's count again (102), the pool came down
    # a request a reading while every request admitted waited in vLLM.
    def reading(memo, width, running, waiting):
        vllm_law(Signals(width=width, in_flight=width, waiting=50, gauges=None, width_age_seconds=25.0),
                 WIDE, VLLM, memo)
        return vllm_law(Signals(width=width, in_flight=width, waiting=50, width_age_seconds=30.0,
                                gauges=gauges(running, waiting, waiting, kv=0.46)), WIDE, VLLM, memo)

    memo = {"last_width": 60}  # 109 came of a growth: its queue may be the growth's prefill backlog
    assert reading(memo, 109, 94, 6).width == 103
    again = reading(memo, 103, 95, 1)
    assert again.width == 99 and memo["cap"] == 99  # 102 less the 2.04 in transit
    # Work waiting at a width no cut to the running cap came to, after a growth, is the lane's
    # count, as before.
    memo = {"last_width": 60}
    assert reading(memo, 103, 95, 1).width == 102


def test_a_probe_step_that_queues_work_is_cut_below_the_lanes_count():
    # Capacity 100, gauges with 10 % noise. A probe from 100 to 105: the reading shows 103 running
    # and 3 waiting (5 wait). By the lane's count 102 ran; the two requests in transit a reading
    # may miss take it to 100. Read as 103, the cap stood there and every request admitted waited
    # for three decisions, until a reading took it down.
    def reading(memo, running, waiting, before):
        memo["last_width"] = before
        vllm_law(Signals(width=105, in_flight=105, waiting=50, gauges=None, width_age_seconds=5.0), WIDE, VLLM, memo)
        return vllm_law(Signals(width=105, in_flight=105, waiting=50, width_age_seconds=10.0,
                                gauges=gauges(running, waiting, waiting, kv=0.45)), WIDE, VLLM, memo)

    memo = {}
    cut = reading(memo, 103, 3, before=100)
    assert cut.width == 100 and memo["cap"] == 100
    # A gauge that reads less than the lane's count (100 running, 4 waiting: one in transit)
    # stands as read.
    assert reading({}, 100, 4, before=100).width == 100
    # After a growth (60 -> 105) the queue may be the growth's prefill backlog: the gauge's count
    # stands, a first measurement a probe confirms.
    cut = reading({}, 103, 3, before=60)
    assert cut.width == 103 and "to be confirmed" in cut.reason
    # At a small width the two in transit are a large share of it: the count is not cut by them.
    # A probe from 7 to 8 reads 8 running and 2 waiting (two replicas of 4 behind one address,
    # each reading one replica's x 2); less two in transit, the lane's 6 took the pool to 4.
    memo = {"last_width": 7}
    vllm_law(Signals(width=8, in_flight=8, waiting=5, gauges=None, width_age_seconds=5.0), WIDE, VLLM, memo)
    held = vllm_law(Signals(width=8, in_flight=8, waiting=5, width_age_seconds=10.0,
                            gauges=gauges(8, 2, 2, kv=0.05)), WIDE, VLLM, memo)
    assert held.width == 8


def test_a_first_caps_probe_that_no_reading_judged_is_tried_again_after_one_reading():
    # The confirmation probe above a first cap met a failed scrape: back to the cap, and the next
    # probe one reading later (a confirmed cap waits its back-off). A start burst's backlog read
    # as a cap of 18 for 100 held the pool at 18 for 380 s that way (F2, 10 % of scrapes failing).
    def probe_unjudged(cap_first):
        memo = {"cap": 18, "cap_endpoints": 1, "measured": 18, "failed": 100, "cap_first": cap_first, "n": 5}
        back = vllm_law(Signals(width=19, in_flight=19, waiting=1000, gauges=gauges(0, ok=False)), WIDE, VLLM, memo)
        assert back.width == 18
        return vllm_law(Signals(width=18, in_flight=18, waiting=1000, gauges=gauges(18, kv=0.08)), WIDE, VLLM, memo)

    assert probe_unjudged(True).width > 18
    waits = probe_unjudged(False)
    assert waits.width == 18 and "no probe above it" in waits.reason
    # A cap read from a burst is a first one until a second reading agrees.
    memo = {}
    vllm_law(Signals(width=100, in_flight=100, waiting=1000, gauges=gauges(18, 82, 82, kv=0.08)), WIDE, VLLM, memo)
    assert memo["cap"] == 18 and memo["cap_first"]


def test_each_probe_that_raises_a_low_cap_doubles_the_next_step():
    # A lane's cap of 40, read in a growth's first interval, for a backend that runs 100: each
    # probe that runs raises it, and the next probe steps twice as far (5 %, 10 %, 20 %...), so
    # a low estimate is left in a few readings, not at 5 % a probe; from the fourth on, +40 %.
    memo = {"cap": 40, "cap_endpoints": 1, "cap_lane": True, "measured": 40, "failed": 400, "n": 3}
    widths = [42]
    for _ in range(5):
        width = widths[-1]
        ran = vllm_law(Signals(width=width, in_flight=width, waiting=1000, gauges=gauges(width, kv=0.2)), WIDE,
                       VLLM, memo)
        assert ran.width == width and "running cap is raised" in ran.reason
        probe = vllm_law(Signals(width=width, in_flight=width, waiting=1000, gauges=gauges(width, kv=0.2)), WIDE,
                         VLLM, memo)
        assert "probe above the running cap" in probe.reason
        widths.append(probe.width)
    assert widths == [42, 47, 57, 80, 112, 157]
    # A probe that fails measures the cap again, and the steps start over at 5 %.
    vllm_law(Signals(width=157, in_flight=157, waiting=1000, gauges=gauges(100, 57, 57, kv=0.5)), WIDE, VLLM, memo)
    assert memo["cap"] == 100 and "cap_raised" not in memo


def test_readings_that_raise_a_cap_at_the_same_probe_count_as_one_raise():
    # A probe at 475 over a lane's cap of 452 is read at 473, 474 and 475 running (requests still
    # starting): one probe that held, so the next steps +10 %, not +40 % (three doublings sent a
    # pool on the physical engines from 475 to 665, and the 190 prompts it admitted at once waited
    # for the engines' token budget).
    memo = {"cap": 452, "cap_endpoints": 1, "cap_lane": True, "measured": 452, "failed": 512, "n": 3}
    for ran in (473, 474, 475):
        held = vllm_law(Signals(width=475, in_flight=475, waiting=1000, gauges=gauges(ran, kv=0.67)), WIDE, VLLM,
                        memo)
        assert held.width == 475 and "running cap is raised" in held.reason and memo["cap"] == ran
    assert memo["cap_raised"] == 1
    probe = vllm_law(Signals(width=475, in_flight=475, waiting=1000, gauges=gauges(475, kv=0.67)), WIDE, VLLM, memo)
    assert "probe above the running cap 475" in probe.reason and probe.width == 523


def test_a_first_cap_with_no_more_waiting_than_a_width_just_over_it_stands_at_once():
    # The KV room said 104; max_num_seqs is 100: 100 run and 2 wait. No prefill backlog leaves
    # 2 of the 64 a growth added: the cap stands for its back-off, no confirmation probe (which
    # made every request admitted for an interval wait).
    memo = {}
    cut = vllm_law(Signals(width=104, in_flight=104, waiting=50, gauges=gauges(100, 2, 2, kv=0.94)), WIDE, VLLM,
                   memo)
    assert cut.width == 100 and "to be confirmed" not in cut.reason
    held = vllm_law(Signals(width=100, in_flight=100, waiting=50, gauges=gauges(100, kv=0.93)), WIDE, VLLM, memo)
    assert held.width == 100 and "no probe above it" in held.reason
    # Three waiting at 100 is more than a width just over the cap: a first measurement.
    cut = vllm_law(Signals(width=104, in_flight=104, waiting=50, gauges=gauges(100, 3, 3, kv=0.94)), WIDE, VLLM,
                   {"last_width": 40})
    assert "to be confirmed" in cut.reason


def test_a_first_cap_read_after_a_small_step_stands_with_a_probes_step_waiting():
    # max_num_seqs binds at 512 (two engines of 256). A growth from 437 to 525 reads 512 running and
    # 11 waiting: no more than a probe's step (26) waits, so this is what a probe of that step
    # would have shown, and the cap stands. Its confirmation probe (538) made every request
    # admitted while it ran wait behind the ones over the cap: about 190 of them an interval.
    def cut_at(width, before, running, waiting):
        memo = {"last_width": before}
        return vllm_law(Signals(width=width, in_flight=width, waiting=500, width_age_seconds=10.0,
                                gauges=gauges(running, waiting, waiting, kv=0.72)), WIDE, VLLM, memo)

    cut = cut_at(525, 437, 512, 11)
    assert cut.width == 512 and "to be confirmed" not in cut.reason
    # More than a probe's step waiting: a first measurement, confirmed by a probe.
    assert "to be confirmed" in cut_at(545, 437, 512, 30).reason
    # After a x4 growth the tail of its prefill backlog can look the same (68 running, 4 waiting
    # after 18 -> 72, on engines that run 512): taken for a cap, it held the pool at 68 all run.
    cut = cut_at(72, 18, 68, 4)
    assert cut.width == 68 and "to be confirmed" in cut.reason
    # So can the width the law began at, which the lane admitted at once: 81 running and 4
    # waiting at a configured 85, under a load below a capacity of 100, held 81 for 72 decisions.
    cut = vllm_law(Signals(width=85, in_flight=85, waiting=0, width_age_seconds=None,
                           gauges=gauges(81, 4, 4, kv=0.35)), WIDE, VLLM, {})
    assert cut.width == 81 and "to be confirmed" in cut.reason


def test_a_first_cap_that_a_growth_ran_none_of_stands_at_once():
    # Capacity 100 (max_num_seqs), the cache at 47 % with a full batch: a reading sees all 100
    # running, nothing waiting, and the width grows into the KV room (208). The next reading
    # sees the same 100 running and 107 waiting: the growth ran none of what it added, so 100
    # is the cap, not a prefill backlog. Its confirmation probe (105) made every request
    # admitted for two decisions wait behind the 5 it queued.
    memo = {}
    grew = vllm_law(Signals(width=100, in_flight=100, waiting=500, gauges=gauges(100, kv=0.47)), WIDE, VLLM, memo)
    assert grew.width == 208
    cut = vllm_law(Signals(width=208, in_flight=208, waiting=500, width_age_seconds=10.0,
                           gauges=gauges(100, 107, 107, kv=0.46)), WIDE, VLLM, memo)
    assert cut.width == 100 and "to be confirmed" not in cut.reason
    held = vllm_law(Signals(width=100, in_flight=100, waiting=500, gauges=gauges(100, kv=0.47)), WIDE, VLLM, memo)
    assert held.width == 100 and "no probe above it" in held.reason
    # A growth that ran some of it (100 -> 120 running) may be a backlog the next steps clear.
    memo = {}
    vllm_law(Signals(width=100, in_flight=100, waiting=500, gauges=gauges(100, kv=0.47)), WIDE, VLLM, memo)
    cut = vllm_law(Signals(width=209, in_flight=209, waiting=500, width_age_seconds=10.0,
                           gauges=gauges(120, 88, 88, kv=0.55)), WIDE, VLLM, memo)
    assert cut.width == 120 and "to be confirmed" in cut.reason
    # So may one after a reading that did not see the whole width running.
    memo = {}
    vllm_law(Signals(width=100, in_flight=100, waiting=500, gauges=gauges(85, kv=0.40)), WIDE, VLLM, memo)
    cut = vllm_law(Signals(width=212, in_flight=212, waiting=500, width_age_seconds=10.0,
                           gauges=gauges(85, 127, 127, kv=0.40)), WIDE, VLLM, memo)
    assert "to be confirmed" in cut.reason


def test_a_first_cap_read_behind_one_address_is_raised_by_a_probe_that_ran_not_forgotten():
    # One address in front of two replicas: each reading is one replica's, x2. A first cap of 88;
    # the probe at 93 "ran 94" (47 x 2), which says the probe held, not that the cap was far off.
    # Forgotten, it sent the width into the KV room (210 for a capacity of 100) until the lane's
    # answers cut it. Now the cap is raised to what ran and the next probe follows.
    def probe_ran(memo):
        return vllm_law(Signals(width=93, in_flight=93, waiting=50, gauges=gauges(47, kv=0.44)), WIDE, VLLM, memo)

    one_of_two = {"replicas": 2, "replicas_guess": 2}
    memo = {**one_of_two, "cap": 88, "cap_endpoints": 1, "measured": 88, "failed": 160}
    held = probe_ran(memo)
    assert held.width == 93 and "running cap is raised" in held.reason and memo["cap"] == 94
    # Read directly (the same 94 seen on the pool's own endpoints), the cap is forgotten.
    memo = {"cap": 88, "cap_endpoints": 1, "measured": 88, "failed": 160}
    grown = vllm_law(Signals(width=93, in_flight=93, waiting=50, gauges=gauges(94, kv=0.44)), WIDE, VLLM, memo)
    assert grown.width > 120 and "cap" not in memo


def test_a_reading_that_saw_far_more_run_than_the_yardstick_allows_drops_it_and_cuts_nothing():
    # The yardstick (1.5 s a call) was taken at 8 running; at 512 the calls take several times
    # that. 239 answers in 5 s read against it "showed" 72 run at once, while this decision's
    # reading saw 496 running and none waiting: the yardstick no longer fits the batch.
    memo = {"proven": 496, "endpoints": 1, "call_s": 1.5, "call_at": 0, "decisions": 5, "was_full": True}
    s = Signals(width=512, in_flight=512, waiting=1000, completions=239, window_seconds=5.0,
                served_concurrency=239 * 10.0 / 5.0, width_age_seconds=5.0,
                gauges=Gauges(ok=True, running=496, waiting=0, waiting_capacity=0, kv_usage=0.7, age_seconds=1.0))
    assert _lane_evidence(s, WIDE, VLLM, memo) is None
    assert "call_s" not in memo
    # The same answers with a reading that saw no more than they say ran: the lane judges them.
    memo = {"proven": 80, "endpoints": 1, "call_s": 1.5, "call_at": 0, "decisions": 5, "was_full": True}
    s = replace(s, gauges=Gauges(ok=True, running=80, waiting=0, waiting_capacity=0, kv_usage=0.2, age_seconds=9.0))
    cut = _lane_evidence(s, WIDE, VLLM, memo)
    assert cut is not None and cut.width == 80 and memo["call_s"] == 1.5


def test_the_lanes_answers_are_counted_over_a_calls_span_so_a_cohort_between_answers_cuts_nothing():
    # Calls of 12.8 s, a decision every 5 s. The 186 admitted by a growth to 452 answered
    # together in the interval before; this one has 104 answers, which alone "show" 266 run of
    # 452. Over the trailing 15 s at 452 (a call's span) the lane's answers show all 452 ran.
    memo = {"proven": 452, "endpoints": 2, "call_s": 12.8, "call_at": 0, "decisions": 9, "was_full": True,
            "answers": [[266, 104, 5.0], [452, 176, 5.0], [452, 250, 5.0], [452, 104, 5.0]]}
    s = answers(452, 104, call=12.8, age=15.0)
    assert _lane_evidence(s, WIDE, VLLM, memo) is None
    # Few answers all through the span: the backend did run fewer (324 of 452); cut to that.
    memo = {**memo, "answers": [[452, 176, 5.0], [452, 100, 5.0], [452, 104, 5.0]]}
    cut = _lane_evidence(s, WIDE, VLLM, memo)
    assert cut is not None and cut.width == 324 and "324 run at once" in cut.reason


def test_a_growth_back_to_a_running_cap_the_gauges_measured_is_left_to_the_readings():
    # After a long-context burst (63 ran, calls of 2.44 s at that batch) the width went back to
    # the running cap of 100 the gauges measured before it. At 100 the calls take about 3 s:
    # 149 answers in 5 s read against 2.44 s "show" 73 run at once. No cut on that.
    memo = {"proven": 63, "endpoints": 2, "call_s": 2.44, "call_at": 0, "decisions": 5, "was_full": True,
            "cap": 100, "cap_endpoints": 2}
    s = Signals(width=100, in_flight=100, waiting=1000, completions=149, window_seconds=5.0,
                served_concurrency=149 * 3.0 / 5.0, width_age_seconds=10.0)
    assert _lane_evidence(s, WIDE, VLLM, memo) is None
    # Above that cap, or with a cap the lane measured itself, the answers judge the growth.
    for more in ({"cap": 90}, {"cap_lane": True}, {"cap_endpoints": 1}):
        cut = _lane_evidence(s, WIDE, VLLM, {**memo, **more})
        assert cut is not None and cut.width == 72, more


def test_a_shrink_is_judged_only_by_a_yardstick_taken_at_about_the_same_batch():
    # One address in front of two replicas: the yardstick (1.28 s a call) was taken at a width of
    # 40; at 88 calls take about 3 s. 153 answers in 5 s read against 1.28 s "show" 39 run of 88.
    memo = {"proven": 88, "endpoints": 1, "call_s": 1.28, "call_width": 40, "call_at": 0, "decisions": 5,
            "was_full": True}
    s = Signals(width=88, in_flight=88, waiting=1000, completions=153, window_seconds=5.0,
                served_concurrency=153 * 2.9 / 5.0, width_age_seconds=10.0)
    assert _lane_evidence(s, WIDE, VLLM, memo) is None
    # The same answers against a yardstick taken at 88: the backend shrank, and the width follows.
    cut = _lane_evidence(s, WIDE, VLLM, {**memo, "call_width": 88})
    assert cut is not None and cut.width == 39


def test_a_growth_is_judged_by_yardsticks_taken_at_about_its_batch():
    # Capacity swings 100 <-> 50: yardsticks were taken at 86 (3.03 s a call) and, last, at 52
    # (2.27 s). Back at 96, calls take about 3.3 s: 149 answers read against 2.27 s "show" 68 run
    # at once and cut to 68. Read against the line through the two (3.25 s at 96), 97 ran.
    memo = {"proven": 52, "endpoints": 2, "call_s": 2.27, "call_width": 52, "call_at": 0, "decisions": 5,
            "was_full": True, "yardsticks": [[86, 3.03], [52, 2.27]]}
    s = Signals(width=96, in_flight=96, waiting=1000, completions=149, window_seconds=5.0,
                served_concurrency=149 * 3.28 / 5.0, width_age_seconds=10.0)
    assert _lane_evidence(s, WIDE, VLLM, dict(memo)) is None
    # With no yardstick near that batch, the last one judges it, as before.
    cut = _lane_evidence(s, WIDE, VLLM, {**memo, "yardsticks": [[52, 2.27]]})
    assert cut is not None and cut.width == 67
    # Well above every yardstick no line is drawn: a jump into the KV room is judged at once.
    jump = replace(s, width=211, in_flight=211, completions=135, served_concurrency=135 * 7.8 / 5.0)
    cut = _lane_evidence(jump, WIDE, VLLM, dict(memo))
    assert cut is not None and cut.width == 61


def test_a_growth_back_to_a_cap_the_lane_measured_waits_for_answers_of_its_own_width():
    # From 52 back to the lane's cap of 96: the calls that end in the growth's own interval began
    # at 52, and 113 answers "show" 51 run at once. Judged by them, the pool went back to 52 and
    # climbed a probe at a time while the capacity was 100.
    memo = {"proven": 52, "endpoints": 2, "call_s": 2.27, "call_width": 52, "call_at": 0, "decisions": 5,
            "was_full": True, "cap": 96, "cap_endpoints": 2, "cap_lane": True}
    s = Signals(width=96, in_flight=96, waiting=1000, completions=113, window_seconds=5.0,
                served_concurrency=72.6, width_age_seconds=5.0)
    assert _lane_evidence(s, WIDE, VLLM, dict(memo)) is None
    # The next interval's answers (all of calls begun at 96) judge it.
    cut = _lane_evidence(replace(s, width_age_seconds=10.0), WIDE, VLLM, dict(memo))
    assert cut is not None and cut.width == 52


def test_a_growth_whose_answers_show_no_more_run_than_before_goes_back_to_the_width_before_it():
    # 100 ran with nothing waiting, the KV room said 208; the interval after the growth's own,
    # 151 answers at a yardstick of 3.48 s "show" 105 run at once: within the count's noise of
    # the 100 before the growth. Back to 100, not 105 (where every request admitted until the
    # next reading waits).
    memo = {"proven": 99, "endpoints": 2, "call_s": 3.48, "call_width": 100, "call_at": 0, "decisions": 5,
            "was_full": True, "width_before": 100}
    s = Signals(width=208, in_flight=208, waiting=1000, completions=151, window_seconds=5.0,
                served_concurrency=151 * 6.9 / 5.0, width_age_seconds=10.0)
    assert _lane_evidence(s, WIDE, VLLM, dict(memo)).width == 100
    # In the growth's own interval the same answers are of calls begun at 100: they judge nothing.
    assert _lane_evidence(replace(s, width_age_seconds=5.0), WIDE, VLLM, dict(memo)) is None
    # Answers that show clearly more than the width before: back to what ran.
    more = replace(s, completions=200, served_concurrency=200 * 6.9 / 5.0)
    assert _lane_evidence(more, WIDE, VLLM, dict(memo)).width == 139
    memo.pop("width_before")
    assert _lane_evidence(s, WIDE, VLLM, memo).width == 105


def test_a_growths_own_interval_is_judged_against_what_the_width_before_answered_by_the_same_yardstick():
    # Calls lengthen as the batch grows and a growth's prompts slow the steps they share: at 179
    # the yardstick (4.87 s, taken at a smaller batch) read 143 answers as 139 run at once. The
    # growth to 251 answered 115 in its own interval, 112 by the same yardstick: within the
    # count's noise of what the width before showed (27 fewer), though 67 fewer than 179. It
    # waits for a reading; it was cut back to 177 (physical P2 seed 10), and the way up again
    # made 59 of the next admissions wait.
    memo = {"proven": 177, "endpoints": 2, "call_s": 4.87, "call_width": 179, "call_at": 0, "decisions": 9,
            "was_full": True, "width_before": 179, "answers": [[179, 133, 5.0], [179, 143, 5.0], [251, 115, 5.0]]}
    growth = Signals(width=251, in_flight=251, waiting=1000, completions=115, window_seconds=5.0,
                     served_concurrency=115 * 6.0 / 5.0, width_age_seconds=5.0)
    assert _lane_evidence(growth, WIDE, VLLM, dict(memo)) is None
    # Answers clearly fewer than the width before showed are the backend shrinking: judged.
    fewer = dict(memo, answers=[[179, 133, 5.0], [179, 143, 5.0], [251, 60, 5.0]])
    cut = _lane_evidence(replace(growth, completions=60, served_concurrency=60 * 6.0 / 5.0), WIDE, VLLM, fewer)
    assert cut is not None and cut.decision == "cut" and cut.width == 177
    # With no answers kept at the width before, it is judged against that width itself.
    alone = dict(memo, answers=[[251, 115, 5.0]])
    assert _lane_evidence(growth, WIDE, VLLM, alone).width == 177


def test_a_small_first_cap_stands_without_a_probe_to_confirm_it():
    # Capacity 1: the growth to 2 shows 1 running and 1 waiting with the cache at 45 %. A probe
    # to confirm it would be +100 % for a reading (capacity 1 settled in 16 decisions); a
    # backlog of one prompt is no token budget's. The cap's back-off starts at once.
    memo = {}
    cut = vllm_law(Signals(width=2, in_flight=2, waiting=50, gauges=gauges(1, 1, 1, kv=0.45)), WIDE, VLLM, memo)
    assert cut.width == 1 and "to be confirmed" not in cut.reason
    at_cap = Signals(width=1, in_flight=1, waiting=50, gauges=gauges(1, kv=0.45))
    for _ in range(VLLM["cap_backoff"]):
        held = vllm_law(at_cap, WIDE, VLLM, memo)
        assert held.width == 1 and "no probe above it" in held.reason
    # A cap of 20 is still a first measurement: the next reading probes above it.
    memo = {}
    assert "to be confirmed" in vllm_law(Signals(width=30, in_flight=30, waiting=50,
                                                 gauges=gauges(20, 10, 10, kv=0.3)), WIDE, VLLM, memo).reason


def test_one_address_in_front_of_two_replicas_is_read_as_one_of_two_after_two_readings():
    # Each scrape reaches one replica of two and sees half the lane's 10 calls: never "near
    # full", the width stayed at 10. Two fresh readings that agree make it one of two.
    memo = {}
    half = Signals(width=10, in_flight=10, waiting=50, gauges=gauges(5, kv=0.05))
    first = vllm_law(half, WIDE, VLLM, memo)
    assert first.width == 10 and "not near full" in first.reason
    second = vllm_law(half, WIDE, VLLM, memo)
    assert second.width > 10 and "one of 2 replicas" in second.reason
    # Saturation is the pool's: 45 running and 5 waiting at one replica is a cap of 90.
    memo_full = dict(memo)
    cut = vllm_law(Signals(width=120, in_flight=120, waiting=50, gauges=gauges(45, 15, 15, kv=0.45)), WIDE, VLLM,
                   memo_full)
    assert cut.width == 90 and "one of 2 replicas" in cut.reason
    # A reading that sees the lane's calls again (one backend now): read as it is.
    whole = Signals(width=10, in_flight=10, waiting=50, gauges=gauges(10, kv=0.1))
    assert "replicas" not in vllm_law(whole, WIDE, VLLM, memo).reason
    # A reading taken before the width changed proves nothing about the share seen.
    memo = {}
    stale = Signals(width=10, in_flight=10, waiting=50, width_age_seconds=1.0, gauges=gauges(5, kv=0.05))
    for _ in range(3):
        assert "replicas" not in vllm_law(stale, WIDE, VLLM, memo).reason


def test_room_for_no_more_than_the_width_that_just_failed_waits_the_probe_back_off():
    # The cache binds at about 20: at 20 running it reads 92 %, "room for 21"; 21 fails. Before,
    # the room was tried again at every reading (a failed probe, a cut, a probe...).
    memo = {}
    tight = Signals(width=20, in_flight=20, waiting=50, gauges=gauges(20, kv=0.92))
    failing = Signals(width=21, in_flight=21, waiting=50, gauges=gauges(20, 1, 1, kv=0.95))
    assert vllm_law(tight, WIDE, VLLM, memo).width == 21
    pauses = []
    for _ in range(4):
        assert vllm_law(failing, WIDE, VLLM, memo).width == 19  # a request below the cache's edge
        holds = 0
        while (proposal := vllm_law(tight, WIDE, VLLM, memo)).decision == "hold":
            assert "no more than the 21 that failed" in proposal.reason
            holds += 1
            assert holds < 1000
        assert proposal.width == 21
        pauses.append(holds)
    assert pauses[1:] == sorted(pauses[1:]) and pauses[-1] >= 2 * pauses[1] > 0, pauses
    # Room well above the width that failed (shorter requests now) is a stale measurement: grow.
    roomy = Signals(width=20, in_flight=20, waiting=50, gauges=gauges(20, kv=0.5))
    assert vllm_law(roomy, WIDE, VLLM, memo).width > 21


def test_a_probe_above_the_running_cap_that_runs_more_forgets_the_cap_and_grows_into_the_room():
    memo = {"cap": 6, "cap_endpoints": 1, "measured": 6, "failed": 9, "n": 40, "cap_quiet_until": 30}
    # Reconfigured to 12: at the probe 7, seven run with nothing waiting (a reading from
    # before the probe could not show that, so no gauge lag is waited for).
    s = Signals(width=7, in_flight=7, waiting=40, gauges=gauges(7, kv=0.07), width_age_seconds=1.0)
    proposal = vllm_law(s, WIDE, VLLM, memo)
    assert proposal.width == 28 and "cap" not in memo


def answers(width, completions, *, waiting=1000, g=None, age=None, window=5.0, call=None):
    """An interval of the lane's own accounting: ``completions`` answers, ``call`` seconds each."""
    call = call if call is not None else width * window / completions
    return Signals(width=width, in_flight=width, waiting=waiting, completions=completions, window_seconds=window,
                   served_concurrency=completions * call / window, gauges=g, width_age_seconds=age)


def test_a_growth_above_what_a_reading_proved_is_undone_by_the_lanes_answers_before_the_next_reading():
    memo = {}
    # A reading: 40 run, nothing waits; 200 answers of 1 s each: the yardstick. The room: x4.
    assert vllm_law(answers(40, 200, g=gauges(40, kv=0.2)), WIDE, VLLM, memo).width == 160
    # No reading for two more decisions, but 160 in flight answer only 475 in 5 s: at 1 s a call
    # the backend ran 95 at once; the other 65 wait in vLLM. In the growth's own interval that is
    # more than the 40 before it ran, so the growth waits for the answers of calls begun at 160
    # (or a reading) to judge it: on the engines a growth's prompts wait for the step's budget.
    assert vllm_law(answers(160, 475, age=5.0), WIDE, VLLM, memo).decision == "hold"
    cut = vllm_law(answers(160, 475, age=10.0), WIDE, VLLM, memo)
    assert cut.width == 95 and cut.decision == "cut" and "95 run at once" in cut.reason
    # The next reading shows 95 running with room in the cache: no jump into the room again, and
    # no probe above it for its back-off.
    held = vllm_law(answers(95, 475, g=gauges(95, kv=0.475), age=10.0), WIDE, VLLM, memo)
    assert held.decision == "hold" and "running cap 95: no probe above it" in held.reason
    # The lane measured the cap in the interval of a growth where the width before ran short
    # (calls begun at 40, the new ones' prefills, or a backend that shrank): the reading probes
    # above it, +5 %, as it would above a first measurement by the gauges, and a probe that
    # runs more raises it.
    memo = {}
    vllm_law(answers(40, 200, g=gauges(40, kv=0.2)), WIDE, VLLM, memo)
    cut = vllm_law(answers(160, 100, age=5.0, call=1.0), WIDE, VLLM, memo)
    assert cut.width == 40 and cut.decision == "cut"
    probe = vllm_law(answers(40, 200, g=gauges(40, kv=0.2), age=10.0), WIDE, VLLM, memo)
    assert probe.width == 42 and "probe above the running cap 40" in probe.reason
    raised = vllm_law(answers(42, 210, g=gauges(42, kv=0.21), age=15.0), WIDE, VLLM, memo)
    assert raised.decision == "hold" and memo["cap"] == 42
    # Measured by the lane in a later interval at one width, the cap keeps its back-off.
    memo = {"proven": 40, "endpoints": 1, "call_s": 1.0, "call_at": 1, "decisions": 5, "was_full": True,
            "full": True}
    cut = vllm_law(answers(160, 475, age=30.0), WIDE, VLLM, memo)
    assert cut.width == 95
    held = vllm_law(answers(95, 475, g=gauges(95, kv=0.475), age=35.0), WIDE, VLLM, memo)
    assert held.decision == "hold" and "running cap 95: no probe above it" in held.reason
    # Answers as many as the width (nothing waits) never cut.
    assert vllm_law(answers(40, 200, g=gauges(40, kv=0.2)), WIDE, VLLM, {}).width == 160
    assert vllm_law(answers(160, 790, age=5.0), WIDE, VLLM, {"proven": 40, "call_s": 1.0}).decision == "hold"


def test_a_probe_above_the_lanes_cap_that_runs_more_raises_it_and_the_next_probe_follows_at_once():
    memo = {"proven": 95, "call_s": 1.0, "call_at": 1, "decisions": 50, "cap": 95, "cap_endpoints": 1,
            "cap_lane": True, "measured": 95, "failed": 160, "n": 40, "cap_quiet_until": 30, "cap_backoff": 24}
    raised = vllm_law(answers(100, 500, g=gauges(100, kv=0.5), age=30.0), WIDE, VLLM, memo)
    assert raised.decision == "hold" and memo["cap"] == 100  # no jump into the room (196)
    # The next probe follows at once, twice the step of the one that raised it (+10 %).
    assert vllm_law(answers(100, 500, g=gauges(100, kv=0.5), age=30.0), WIDE, VLLM, memo).width == 110


def test_a_drop_below_what_a_reading_showed_is_cut_by_the_lanes_answers_without_a_cap():
    # A reading showed 100 running, nothing waiting; then the backend halves: 100 in flight
    # answer 250 in 5 s at 1 s a call. Back to 50, as a measurement, not a running cap.
    memo = {}
    vllm_law(answers(100, 500, g=gauges(100, kv=0.5)), WIDE, VLLM, memo)
    cut = vllm_law(answers(100, 250, age=None), WIDE, VLLM, memo)
    assert cut.width == 50 and memo["measured"] == 50 and not memo.get("cap_lane")


def test_a_reading_inside_the_interval_that_saw_the_width_run_with_nothing_waiting_overrules_the_lanes_answers():
    # vLLM's decode step slows as the batch grows: at 64 running a call takes 2.5 s against the
    # yardstick's 1 s. The same answers read alone as a backend shrunk to 25.
    def after_a_reading_at_64() -> dict:
        memo = {}
        vllm_law(answers(64, 320, g=gauges(64, kv=0.9)), WIDE, VLLM, memo)  # 1 s a call; 64 proven
        return memo

    slower = answers(64, 128, call=2.5)
    assert vllm_law(slower, WIDE, VLLM, after_a_reading_at_64()).width == 25
    # A reading of this decision saw the 64 run and none wait: slower calls, not a shrink. (The
    # width changed 5 s ago: too recent for the interval to be a new yardstick.)
    seen = answers(64, 128, call=2.5, g=gauges(64, kv=0.9), age=5.0)
    assert vllm_law(seen, WIDE, VLLM, after_a_reading_at_64()).decision != "cut"


def test_answers_that_fall_short_read_the_gauges_at_the_next_decision_and_a_stale_reading_keeps_the_yardstick():
    # Settled at 100 with nothing waiting: 150 answers in 5 s, 3.33 s a call (the yardstick).
    memo = {}
    vllm_law(answers(100, 150, g=gauges(100, kv=0.47)), WIDE, VLLM, memo)
    assert memo["call_s"] == 100 * 5.0 / 150 and not wants_reading({"vllm": memo})
    # The KV cache starts to bind: 128 answers show about 85 run of the 100 in flight. Within the
    # count's noise (no cut), but the next decision reads the gauges instead of waiting for the
    # scrape's cadence (12 s).
    short = vllm_law(answers(100, 128), WIDE, VLLM, memo)
    assert short.decision == "hold" and wants_reading({"vllm": memo})
    # That reading is 3-6 s old and still shows 100 running, nothing waiting: it cuts nothing, but
    # the interval's calls (longer by the waiting) do not become the yardstick, and the gauges are
    # read once more.
    stale = vllm_law(answers(100, 118, g=gauges(100, kv=0.47)), WIDE, VLLM, memo)
    assert stale.decision != "cut" and memo["call_s"] == 100 * 5.0 / 150 and wants_reading({"vllm": memo})
    # The next one shows the drop: cut to what runs (a share below it: the cache binds).
    assert vllm_law(answers(100, 118, g=gauges(63, waiting=37, capacity=37, kv=0.99)), WIDE, VLLM, memo).width == 61


def test_a_second_reading_that_sees_nothing_waiting_makes_the_longer_calls_the_yardstick():
    memo = {}
    vllm_law(answers(100, 150, g=gauges(100, kv=0.47)), WIDE, VLLM, memo)
    vllm_law(answers(100, 118, g=gauges(100, kv=0.47)), WIDE, VLLM, memo)  # kept, read again
    assert memo["call_s"] == 100 * 5.0 / 150
    # Nothing waits at the second look either: the calls are longer (longer prompts), not waiting.
    vllm_law(answers(100, 118, g=gauges(100, kv=0.47)), WIDE, VLLM, memo)
    assert memo["call_s"] == 100 * 5.0 / 118 and not wants_reading({"vllm": memo})


def test_a_cut_by_the_lanes_answers_asks_for_no_early_reading():
    # The next reading, 3-6 s old, would show the width before the cut: nothing to read early for.
    memo = {}
    vllm_law(answers(100, 500, g=gauges(100, kv=0.5)), WIDE, VLLM, memo)
    assert vllm_law(answers(100, 250), WIDE, VLLM, memo).width == 50
    assert not wants_reading({"vllm": memo})


def test_answers_within_a_third_of_the_counts_noise_ask_for_no_reading():
    memo = {}
    vllm_law(answers(100, 150, g=gauges(100, kv=0.47)), WIDE, VLLM, memo)
    assert vllm_law(answers(100, 140), WIDE, VLLM, memo).decision == "hold"  # about 93 of 100 ran
    assert not wants_reading({"vllm": memo})


def test_a_lane_draining_a_cut_is_not_judged_by_its_answers():
    # Cut from 100 to 50: the 100 admitted before finish at the backend's pace. Their few answers
    # over the interval are not a backend that runs 4 at once (a pool once went to 7 that way).
    memo = {}
    vllm_law(answers(100, 500, g=gauges(100, kv=0.5)), WIDE, VLLM, memo)
    draining = Signals(width=50, in_flight=100, waiting=1000, completions=20, window_seconds=5.0,
                       served_concurrency=20 * 1.0 / 5.0, width_age_seconds=5.0)
    assert vllm_law(draining, WIDE, VLLM, memo).decision == "hold"


def test_few_answers_or_no_yardstick_leave_the_judging_to_the_readings():
    yardstick = {"proven": 10, "call_s": 1.0}
    # 10 in flight, 40 answers where 50 were due: within the count's own noise (3 / sqrt(40)).
    assert vllm_law(answers(12, 40, age=5.0), WIDE, VLLM, dict(yardstick)).decision == "hold"
    assert vllm_law(answers(160, 19, age=5.0), WIDE, VLLM, dict(yardstick)).decision == "hold"
    assert vllm_law(answers(160, 475, age=5.0), WIDE, VLLM, {"proven": 40}).decision == "hold"


def test_calls_that_slow_with_the_batch_are_not_taken_for_waiting():
    memo = {}
    vllm_law(answers(20, 100, g=gauges(20, kv=0.02)), WIDE, VLLM, memo)  # 1 s a call at 20
    assert vllm_law(answers(80, 185, age=5.0), WIDE, VLLM, memo).decision == "hold"  # its own interval
    assert vllm_law(answers(80, 185, age=10.0), WIDE, VLLM, memo).width == 37
    # Settled at 37 with nothing waiting, a call takes 1.26 s: the steps slowed with the batch,
    # so the "waiting" was the batch's own pace. The lane's cap is dropped; readings judge.
    vllm_law(answers(37, 147, age=None), WIDE, VLLM, memo)
    s = answers(37, 147, g=gauges(37, kv=0.04), age=30.0, call=1.26)
    grow = vllm_law(s, WIDE, VLLM, memo)
    assert memo.get("slows") and "cap" not in memo and grow.width > 37
    assert vllm_law(answers(148, 300, age=5.0), WIDE, VLLM, memo).decision == "hold"


def test_a_probe_no_reading_could_judge_waits_the_caps_back_off_again():
    memo = {"cap": 100, "cap_endpoints": 1, "measured": 100, "failed": 160, "n": 40, "cap_quiet_until": 30,
            "cap_backoff": 24}
    failed = Gauges(ok=False, error="timed out")
    given_up = vllm_law(Signals(width=105, in_flight=105, waiting=50, gauges=failed), WIDE, VLLM, memo)
    assert given_up.width == 100
    near = Signals(width=100, in_flight=100, waiting=50, gauges=gauges(100, kv=0.5))
    assert "no probe above it for 23 more" in vllm_law(near, WIDE, VLLM, memo).reason


def test_gauges_that_still_show_a_burst_the_lane_has_finished_never_grow_it():
    # The scrape lags dispatch: 9 of 10 running a moment ago, nothing in flight now.
    lagging = Signals(width=10, in_flight=0, waiting=0, gauges=gauges(9))
    assert vllm_law(lagging, Bounds(1, 512), VLLM, {}).decision == "hold"


def test_without_the_capacity_gauge_waiting_above_the_threshold_or_a_full_kv_cache_is_saturation():
    legacy = Gauges(ok=True, running=8, waiting=3, waiting_capacity=None, kv_usage=0.7)
    assert vllm_law(Signals(width=12, in_flight=11, waiting=0, gauges=legacy), WIDE, VLLM, {}).width == 8
    full_cache = Gauges(ok=True, running=9, waiting=0, waiting_capacity=0, kv_usage=0.99)
    # The cache binds: a request below the running count at its edge (see the test below).
    assert vllm_law(Signals(width=12, in_flight=12, waiting=0, gauges=full_cache), WIDE, VLLM, {}).width == 8


def test_a_cut_where_the_kv_cache_binds_goes_below_the_running_count_at_its_edge():
    # Capacity 100 -> 50 by the cache: 53 running at 98 % with 48 waiting. A width of 53 kept the
    # cache at its edge, and a third of each interval's admissions waited or were preempted.
    edge = Gauges(ok=True, running=53, waiting=48, waiting_capacity=48, kv_usage=0.98)
    cut = vllm_law(Signals(width=100, in_flight=100, waiting=50, gauges=edge), WIDE, VLLM, {})
    assert cut.decision == "cut" and cut.width == 51
    assert "51, below the 53 running at the cache's edge" in cut.reason
    # At the cut's width, a full cache with nothing waiting still cuts a share below what runs.
    steady = Gauges(ok=True, running=51, waiting=0, waiting_capacity=0, kv_usage=0.98)
    assert vllm_law(Signals(width=51, in_flight=51, waiting=50, gauges=steady), WIDE, VLLM, {}).width == 49
    # Where max_num_seqs binds (the cache has room), the cut goes to the running count itself.
    capped = Gauges(ok=True, running=100, waiting=5, waiting_capacity=5, kv_usage=0.47)
    assert vllm_law(Signals(width=105, in_flight=105, waiting=50, gauges=capped), WIDE, VLLM, {}).width == 100


def test_a_failed_scrape_holds_the_last_good_width():
    s = Signals(width=40, in_flight=40, waiting=5, gauges=Gauges(ok=False, error="connection refused"))
    proposal = vllm_law(s, Bounds(4, 512), VLLM, {})
    assert proposal.width == 40 and proposal.decision == "hold" and "connection refused" in proposal.reason


def test_after_a_long_outage_the_width_goes_back_to_the_configured_one_never_up():
    failed = Gauges(ok=False, error="timed out")
    above = Signals(width=40, in_flight=40, waiting=5, gauges=failed, configured=10, outage_seconds=301.0)
    assert vllm_law(above, Bounds(4, 512), VLLM, {}).width == 10
    below = Signals(width=6, in_flight=6, waiting=5, gauges=failed, configured=10, outage_seconds=301.0)
    assert vllm_law(below, Bounds(4, 512), VLLM, {}).width == 6
    short = Signals(width=40, in_flight=40, waiting=5, gauges=failed, configured=10, outage_seconds=100.0)
    assert vllm_law(short, Bounds(4, 512), VLLM, {}).width == 40


def test_an_endpoint_missing_from_a_reading_is_held_and_nothing_grows_on_it():
    # Two replicas; one answered with 20 running, nothing waiting; the other is missing with 20 in flight there.
    partial = Gauges(ok=True, running=20, waiting=0, waiting_capacity=0, kv_usage=0.5, endpoints=2, fresh=1, held=20)
    s = Signals(width=40, in_flight=40, waiting=30, gauges=partial)
    proposal = vllm_law(s, WIDE, VLLM, {})
    assert proposal.decision == "hold" and "1 of 2 endpoints fresh" in proposal.reason
    # The one that answered is saturated: the cut keeps what the missing one holds.
    saturated = Gauges(ok=True, running=15, waiting=5, waiting_capacity=5, kv_usage=0.5, endpoints=2, fresh=1, held=20)
    assert vllm_law(Signals(width=40, in_flight=40, waiting=30, gauges=saturated), WIDE, VLLM, {}).width == 35
    # A dead replica the picker stopped calling holds nothing: the width follows the survivor.
    dead = Gauges(ok=True, running=25, waiting=5, waiting_capacity=5, kv_usage=0.5, endpoints=2, fresh=1, held=0)
    assert vllm_law(Signals(width=40, in_flight=30, waiting=30, gauges=dead), WIDE, VLLM, {}).width == 25


def test_growth_needs_work_waiting_in_the_lane_and_a_reading_taken_after_the_width_changed():
    near = gauges(9)
    assert vllm_law(Signals(width=10, in_flight=10, waiting=0, gauges=near), WIDE, VLLM, {}).decision == "hold"
    # A probe above the measured 10 began 4 s ago; a reading now may still show the gauges of
    # before it (6 s lag by default), so it cannot say the probe held.
    early = Signals(width=10, in_flight=10, waiting=5, gauges=near, width_age_seconds=4.0)
    assert "before the width changed" in vllm_law(early, WIDE, VLLM, {"measured": 10}).reason
    late = Signals(width=10, in_flight=10, waiting=5, gauges=near, width_age_seconds=7.0)
    assert vllm_law(late, WIDE, VLLM, {"measured": 10}).decision == "grow"


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


def test_a_growth_past_what_was_measured_asks_for_a_reading_at_every_decision_until_one_judges_it():
    # While a growth the backend cannot run is out, every request admitted waits in vLLM:
    # the loop reads the gauges at each decision (not at the scrape cadence) until a reading
    # taken gauge_lag_seconds after the change judges it.
    memos: dict = {}
    lag = VLLM["gauge_lag_seconds"]
    grew = compose({"vllm": VLLM}, Signals(width=10, in_flight=10, waiting=30, gauges=gauges(9)), WIDE, memos)
    assert grew.width == 17 and wants_reading(memos)  # into the room no reading has judged
    early = Signals(width=17, in_flight=17, waiting=30, gauges=gauges(16, kv=0.8), width_age_seconds=lag / 2)
    assert compose({"vllm": VLLM}, early, WIDE, memos).decision == "hold" and wants_reading(memos)
    judged = Signals(width=17, in_flight=17, waiting=0, gauges=gauges(15, kv=0.8), width_age_seconds=lag + 1)
    assert compose({"vllm": VLLM}, judged, WIDE, memos).decision == "hold" and not wants_reading(memos)
    # A saturated reading cuts at once, however early. A first running cap asks for one reading
    # more, at the next decision (it may be the growth's prefill backlog); after that reading
    # nothing is waited for.
    memos = {}
    compose({"vllm": VLLM}, Signals(width=10, in_flight=10, waiting=30, gauges=gauges(9)), WIDE, memos)
    cut = Signals(width=17, in_flight=17, waiting=30, gauges=gauges(12, 5, 5, kv=0.6), width_age_seconds=1.0)
    assert compose({"vllm": VLLM}, cut, WIDE, memos).decision == "cut" and wants_reading(memos)
    after = Signals(width=12, in_flight=12, waiting=30, gauges=gauges(12, kv=0.6), width_age_seconds=5.0)
    assert compose({"vllm": VLLM}, after, WIDE, memos).width == 12 and not wants_reading(memos)
    # Back up to a capacity already measured: nothing new to judge, the scrape cadence stands.
    memos = {"vllm": {"cap": 100, "cap_endpoints": 1, "measured": 100}}
    back = compose({"vllm": VLLM}, Signals(width=50, in_flight=50, waiting=30, gauges=gauges(50, kv=0.25)), WIDE, memos)
    assert back.width == 100 and not wants_reading(memos)
    # A growth another controller vetoes is no growth: nothing is waited for.
    memos = {}
    vetoed = compose({"overload": OVERLOAD, "vllm": VLLM},
                     Signals(width=10, in_flight=10, waiting=30, admitted=3, gauges=gauges(9)), WIDE, memos)
    assert vetoed.width <= 10 and not wants_reading(memos)


# --- the lane's answers judge a probe and look twice at a drop ---

PROBE_JUDGED = {**VLLM, "lane_probe": 0.03}  # off by default (the catalog's registry says why)


def test_a_probe_above_the_running_cap_is_judged_by_readings_alone_by_default():
    assert VLLM["lane_probe"] == 0.0


def test_a_probe_above_the_running_cap_is_failed_by_the_lanes_answers_before_the_next_reading():
    memo = {"proven": 100, "endpoints": 1, "call_s": 1.0, "call_at": 1, "decisions": 50, "cap": 100, "cap_endpoints": 1,
            "measured": 100, "failed": 196, "n": 40, "cap_quiet_until": 40, "cap_backoff": 24}
    # The probe 105 answered 485 in 5 s at 1.07 s a call: about 97 ran, the rest queued in vLLM.
    cut = vllm_law(answers(105, 485, age=5.0, call=1.07), WIDE, PROBE_JUDGED, memo)
    assert cut.width == 100 and cut.decision == "cut" and "probe at 105" in cut.reason
    assert memo["cap_backoff"] == 48 and memo["failed"] == 105  # failed as a probe: the back-off doubles


def test_a_probe_that_runs_or_is_not_judged_by_the_lane_holds():
    base = {"proven": 100, "endpoints": 1, "call_s": 1.0, "call_at": 1, "decisions": 50, "cap": 100, "cap_endpoints": 1,
            "measured": 100, "failed": 196, "n": 40, "cap_quiet_until": 40, "cap_backoff": 24}
    # The backend grew: 105 ran at the yardstick's pace (within the count's noise).
    assert vllm_law(answers(105, 520, age=5.0, call=1.01), WIDE, PROBE_JUDGED, dict(base)).decision == "hold"
    # Fewer answers, but calls no longer than the yardstick: nothing waited.
    assert vllm_law(answers(105, 485, age=5.0, call=1.0), WIDE, PROBE_JUDGED, dict(base)).decision == "hold"
    # The interval began before the probe (its calls are not all the probe's).
    assert vllm_law(answers(105, 485, age=3.0, call=1.07), WIDE, PROBE_JUDGED, dict(base)).decision == "hold"
    # A cap measured on another set of endpoints says nothing of this one.
    assert vllm_law(answers(105, 485, age=5.0, call=1.07), WIDE, PROBE_JUDGED, dict(base, endpoints=2)).decision == "hold"
    # A small lane: 28 answers vary their mean by more than 3 %; 8 % longer is inside that noise.
    small = {**base, "proven": 6, "cap": 6, "measured": 6, "failed": 9}
    assert vllm_law(answers(7, 28, age=5.0, call=1.08), WIDE, PROBE_JUDGED, dict(small)).decision == "hold"
    assert vllm_law(answers(7, 28, age=5.0, call=1.2), WIDE, PROBE_JUDGED, dict(small)).width == 6
    # Off: the readings alone judge a probe.
    off = {**VLLM, "lane_probe": 0.0}
    assert vllm_law(answers(105, 485, age=5.0, call=1.07), WIDE, off, dict(base)).decision == "hold"


def test_after_a_cut_to_a_shrunk_backend_the_lanes_answers_look_once_more():
    memo = {}
    vllm_law(answers(100, 500, g=gauges(100, kv=0.5)), WIDE, VLLM, memo)  # 1 s a call at 100
    # The backend halves; the interval began with the batch above 50 still finishing: 57 ran.
    first = vllm_law(answers(100, 285, age=None, call=1.55), WIDE, VLLM, memo)
    assert first.width == 57 and memo["lane_cut"] == "shrink"
    # At 57 throughout, 250 answers (50 ran) at 1.5 s a call: 7 wait in vLLM. Cut again, to 50.
    second = vllm_law(answers(57, 250, age=5.0, call=1.5), WIDE, VLLM, memo)
    assert second.width == 50 and second.decision == "cut"
    # Once only: a third look waits for the next reading.
    assert vllm_law(answers(50, 230, age=5.0, call=1.5), WIDE, VLLM, memo).decision == "hold"


def test_the_second_look_needs_calls_that_waited_and_can_be_turned_off():
    def after_first(params):
        memo = {}
        vllm_law(answers(100, 500, g=gauges(100, kv=0.5)), WIDE, params, memo)
        assert vllm_law(answers(100, 285, age=None, call=1.55), WIDE, params, memo).width == 57
        return memo
    # 250 answers, but at the yardstick's pace: a noisy count, not a queue.
    assert vllm_law(answers(57, 250, age=5.0, call=1.0), WIDE, VLLM, after_first(VLLM)).decision == "hold"
    off = {**VLLM, "lane_rejudge": 0.0}
    assert vllm_law(answers(57, 250, age=5.0, call=1.5), WIDE, off, after_first(off)).decision == "hold"


def test_a_first_cap_a_probe_ran_past_sends_the_width_back_to_where_it_was_read_not_into_the_kv_room():
    # Capacity 100 (max_num_seqs), the cache at 47 % with a full batch. A start's burst is read
    # as 82 running and 18 waiting at 100: a first cap of 82. The probe at 87 runs all 87, so 82
    # was a prefill backlog and is forgotten; the growth goes back to the 100 it was read at, not
    # into the KV room (208, where 107 requests waited until the next reading cut it).
    def step(width, seen, age=10.0):
        return vllm_law(Signals(width=width, in_flight=width, waiting=500, width_age_seconds=age,
                                gauges=seen), WIDE, VLLM, memo)

    memo = {}
    cut = step(100, gauges(82, 18, 18, kv=0.35), age=None)
    assert cut.width == 82 and "to be confirmed" in cut.reason
    assert step(82, gauges(82, kv=0.38)).width == 87
    back = step(87, gauges(87, kv=0.41))
    assert back.width == 100 and "prefill backlog was read at" in back.reason
    # Above it, probes: 5 % first. One that runs no more than the 100 before it finds the cap,
    # which stands at once.
    assert step(100, gauges(100, kv=0.47)).width == 105
    found = step(105, gauges(100, 5, 5, kv=0.46))
    assert found.width == 100 and "to be confirmed" not in found.reason
    assert "backlog_ceiling" not in memo
    # A backend far wider than the width the backlog was read at: each probe that holds doubles
    # the next one's step (5, 10, 20, then 40 %), within the KV room.
    memo = {}
    step(100, gauges(82, 18, 18, kv=0.35), age=None)
    step(82, gauges(82, kv=0.10))
    widths = [step(87, gauges(87, kv=0.10)).width]
    for _ in range(6):
        widths.append(step(widths[-1], gauges(widths[-1], kv=0.10)).width)
    assert widths == [100, 105, 116, 140, 196, 275, 385]


def test_a_first_cap_outrun_while_the_lane_drains_the_cut_sends_the_width_back_at_once():
    # Two engines of max_num_seqs 256. A growth 128 -> 512 is read 5 s after it at 308 running
    # and 204 waiting: the growth's prompts waiting for the step's token budget, taken for a first
    # running cap of 308. The reading at the next decision, while the lane still drains the cut
    # (488 in flight), sees 488 running: vLLM never runs more than max_num_seqs, so 308 was a
    # backlog. The width goes back towards 512 at once, no higher than what is in flight (what
    # ended since is admitted again, not the whole growth a second time), where a probe after the
    # drain admitted the growth again and its prompts waited again (over twelve seeds: physical
    # P0 8.3 -> 6.0 % of requests waited).
    memo = {}
    cut = vllm_law(Signals(width=512, in_flight=512, waiting=900, width_age_seconds=5.0,
                           gauges=gauges(308, 204, 204, kv=0.40)), WIDE, VLLM, memo)
    assert cut.width == 308 and "to be confirmed" in cut.reason and memo["cap_check"]
    back = vllm_law(Signals(width=308, in_flight=488, waiting=900, width_age_seconds=5.0,
                            gauges=gauges(488, kv=0.66)), WIDE, VLLM, memo)
    assert back.width == 488 and "prefill backlog" in back.reason and "cap" not in memo
    assert memo["backlog_ceiling"] == 512  # above it, probes (see the test above)
    # Where max_num_seqs binds, the reading after the cut sees no more running than the cap: it
    # stands, and the lane drains to it.
    memo = {}
    vllm_law(Signals(width=512, in_flight=512, waiting=900, width_age_seconds=5.0,
                     gauges=gauges(308, 204, 204, kv=0.40)), WIDE, VLLM, memo)
    kept = vllm_law(Signals(width=308, in_flight=420, waiting=900, width_age_seconds=5.0,
                            gauges=gauges(308, 112, 112, kv=0.40)), WIDE, VLLM, memo)
    assert kept.width == 308 and memo["cap"] == 308 and not memo.get("cap_check")
    # Past the cap with work still waiting, what ran is a first cap again: the width goes to it,
    # not back to where the first was read (one address in front of two replicas read 88 at 160,
    # then 100 running and 44 waiting; back at 160, 60 waited), and a probe confirms it.
    memo = {}
    vllm_law(Signals(width=160, in_flight=160, waiting=900, width_age_seconds=5.0,
                     gauges=gauges(88, 72, 72, kv=0.39)), WIDE, VLLM, memo)
    again = vllm_law(Signals(width=88, in_flight=88, waiting=900, width_age_seconds=5.0,
                             gauges=gauges(100, 44, 44, kv=0.46)), WIDE, VLLM, memo)
    assert again.width == 100 and "a first cap of 100" in again.reason
    assert memo["cap"] == 100 and memo["cap_first"] and memo["cap_check"] and "backlog_ceiling" not in memo
    # The backend ran those 100: a failed scrape then holds them, as it holds any width the
    # backend was seen running. It took the width back to the 88 cut before (a "probe" above the
    # capacity measured then), and the way up again admitted the drained calls a second time
    # (physical P2 seed 12: 399 -> 177 -> 399, and 221 of the 222 admitted again waited).
    held = vllm_law(Signals(width=100, in_flight=100, waiting=900, width_age_seconds=5.0,
                            gauges=Gauges(ok=False, error="timed out")), WIDE, VLLM, memo)
    assert held.width == 100 and held.decision == "hold"
    # A count past the cap by no more than the requests in transit proves nothing.
    memo = {}
    vllm_law(Signals(width=512, in_flight=512, waiting=900, width_age_seconds=5.0,
                     gauges=gauges(308, 204, 204, kv=0.40)), WIDE, VLLM, memo)
    vllm_law(Signals(width=308, in_flight=420, waiting=900, width_age_seconds=5.0,
                     gauges=gauges(312, kv=0.40)), WIDE, VLLM, memo)
    assert memo["cap"] == 308


def test_a_first_cap_read_again_at_its_count_with_work_still_waiting_stands_without_a_probe():
    # Two engines of max_num_seqs 256. A growth to 691 is read at 512 running and 175 waiting: a
    # first cap, to be confirmed. The reading at the next decision, while the lane drains the cut,
    # sees 512 running again and 125 still waiting. A prefill backlog would have drained between
    # the two (the cut admits nothing new): the same count with a queue is the batch's limit. It
    # stands, and no probe follows until its back-off ends; the probe to 538 made 375 requests
    # wait over two intervals on physical P3 seed 7.
    memo = {}
    cut = vllm_law(Signals(width=691, in_flight=691, waiting=900, width_age_seconds=5.0,
                           gauges=gauges(512, 175, 175, kv=0.73)), WIDE, VLLM, memo)
    assert cut.width == 512 and "to be confirmed" in cut.reason
    again = vllm_law(Signals(width=512, in_flight=600, waiting=900, width_age_seconds=5.0,
                             gauges=gauges(512, 125, 125, kv=0.73)), WIDE, VLLM, memo)
    assert again.width == 512 and "the cap stands" in again.reason
    assert not memo["cap_first"] and "cap_read_at" not in memo and memo["cap_backoff"] == VLLM["cap_backoff"]
    for _ in range(3):
        held = vllm_law(Signals(width=512, in_flight=512, waiting=900, width_age_seconds=10.0,
                                gauges=gauges(509, kv=0.72)), WIDE, VLLM, memo)
        assert held.width == 512, held.reason
    # The queue gone by the second reading: it may have been a backlog the budget took, and the
    # probe that confirms the cap follows at the next reading, as before.
    memo = {}
    vllm_law(Signals(width=691, in_flight=691, waiting=900, width_age_seconds=5.0,
                     gauges=gauges(512, 175, 175, kv=0.73)), WIDE, VLLM, memo)
    vllm_law(Signals(width=512, in_flight=600, waiting=900, width_age_seconds=5.0,
                     gauges=gauges(512, kv=0.73)), WIDE, VLLM, memo)
    assert memo["cap_first"]
    probe = vllm_law(Signals(width=512, in_flight=512, waiting=900, width_age_seconds=10.0,
                             gauges=gauges(509, kv=0.72)), WIDE, VLLM, memo)
    assert probe.width > 512 and "probe above the running cap 512" in probe.reason


def test_a_probe_is_judged_against_the_last_reading_at_the_width_below_it():
    # Capacity 100. The width ran all 100 with nothing waiting, and a probe took it to 105. The
    # reading in the probe's gauge lag still saw 100 and none waiting (of the width before); the
    # next saw 100 running and 4 waiting. The probe ran none of the 5 it added: 100 is the cap and
    # stands at once, judged against the reading at 100, not the lagging one at 105. Its
    # confirmation probe made every request admitted for an interval wait again (over twelve
    # seeds: F12 7.3 -> 7.0 %, physical P2 8.8 -> 8.3 %).
    memo = {"backlog_ceiling": 100, "backlog_steps": 0}
    probe = vllm_law(Signals(width=100, in_flight=100, waiting=500, width_age_seconds=10.0,
                             gauges=gauges(100, kv=0.46)), WIDE, VLLM, memo)
    assert probe.width == 105
    early = vllm_law(Signals(width=105, in_flight=105, waiting=500, width_age_seconds=5.0,
                             gauges=gauges(100, kv=0.47)), WIDE, VLLM, memo)
    assert early.width == 105 and early.decision == "hold"
    cut = vllm_law(Signals(width=105, in_flight=105, waiting=500, width_age_seconds=10.0,
                           gauges=gauges(100, 4, 4, kv=0.47)), WIDE, VLLM, memo)
    assert cut.width == 100 and "to be confirmed" not in cut.reason
    held = vllm_law(Signals(width=100, in_flight=100, waiting=500, width_age_seconds=5.0,
                            gauges=gauges(100, kv=0.47)), WIDE, VLLM, memo)
    assert "no probe above it" in held.reason

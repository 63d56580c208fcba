"""The engine alone, on an injected clock: exact times, no sleeping.

These pin the laws the HTTP tests see through the network: admission by KV
blocks, preemption of the newest request, deferral, queue time at finish,
gauges published per step with a lag, and latency that follows the prompt,
the queue and the batch.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanes.sim import EngineCore, SimModel, SimRequest
from lanes.sim.model import new_rng


class Clock:
    """Drives one engine through its own wake-ups, as the server's timer does."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.now = 0.0

    def add(self, request: SimRequest) -> SimRequest:
        request.arrived = self.now
        request.defer_until += self.now
        self.core.add(request)
        self.core.advance(self.now)
        return request

    def run_until(self, t: float) -> None:
        while (wakeup := self.core.next_wakeup(self.now)) is not None and wakeup <= t:
            self.now = wakeup
            self.core.advance(self.now)
        self.now = t
        self.core.advance(t)

    def run(self) -> None:
        while (wakeup := self.core.next_wakeup(self.now)) is not None:
            self.now = wakeup
            self.core.advance(self.now)


# A plain law for exact times: 10 ms a step, nothing per sequence, context or prompt token.
LAW = dict(per_token_ms=10.0, per_seq_ms=0.0, context_ms_per_1k=0.0, prefill_ms_per_token=0.0, ttft_ms=0.0)


def engine(**settings) -> tuple[EngineCore, Clock]:
    model = SimModel(name="m", **{**LAW, **settings})
    core = EngineCore(model, new_rng(model))
    return core, Clock(core)


def chat(prompt: int = 2, tokens: int = 4, defer_s: float = 0.0) -> SimRequest:
    # defer_until is relative here; Clock.add makes it absolute
    return SimRequest(prompt_tokens=prompt, max_tokens=tokens, arrived=0.0, defer_until=defer_s)


def test_a_short_prompt_on_an_idle_engine_takes_ttft_then_a_step_per_token():
    core, clock = engine(ttft_ms=40)  # a prefill step: 10 + 40 ms
    request = clock.add(chat(tokens=5))
    clock.run()
    assert request.first_token_at == pytest.approx(0.05)
    assert request.last_token_at == pytest.approx(0.09)
    assert request.state == "finished" and request.generated == 5


def test_ttft_grows_with_the_prompt_and_its_chunks_of_the_step_budget():
    ttfts = {}
    for prompt in (100, 8000, 20000):
        core, clock = engine(kv_blocks=4096, max_num_batched_tokens=8192, ttft_ms=40, prefill_ms_per_token=0.02)
        request = clock.add(chat(prompt=prompt))
        clock.run()
        ttfts[prompt] = request.first_token_at
    # one prefill step of 50 ms + 0.02 ms per prompt token; 20000 tokens take 3 steps
    assert ttfts[100] == pytest.approx(0.050 + 0.002)
    assert ttfts[8000] == pytest.approx(0.050 + 0.160)
    assert ttfts[20000] == pytest.approx(3 * 0.050 + 0.400)


def test_ttft_includes_the_queue_and_queue_time_is_recorded_at_finish():
    core, clock = engine(capacity=1, ttft_ms=40)
    first, second = clock.add(chat(tokens=3)), clock.add(chat(tokens=3))
    assert (len(core.running), len(core.waiting)) == (1, 1)
    clock.run_until(0.069)  # the first has its first token, not yet its last
    assert core.counters.queue_time.count == 0  # nobody has finished yet
    clock.run()
    assert first.last_token_at == pytest.approx(0.07)
    assert second.first_token_at == pytest.approx(0.07 + 0.05)
    assert core.counters.queue_time.count == 2
    assert core.counters.queue_time.sum == pytest.approx(0.07)


def test_time_per_token_follows_the_batch_on_every_token():
    # a + b x batch: 12.5 ms a step alone, 20 ms with four, far below max_num_seqs 64
    core, clock = engine(capacity=64, per_token_ms=10, per_seq_ms=2.5)
    alone = clock.add(chat(tokens=40))
    clock.run_until(0.045)  # three tokens alone
    gaps_alone = alone.last_token_at
    for _ in range(3):
        clock.add(chat(tokens=40))
    before = alone.generated
    clock.run_until(clock.now + 0.2)
    tokens_in_200ms = alone.generated - before
    assert gaps_alone == pytest.approx(0.0375)
    assert 9 <= tokens_in_200ms <= 10


def test_the_context_the_batch_attends_slows_every_step():
    core, clock = engine(per_token_ms=10, context_ms_per_1k=5, kv_blocks=8192)
    short = clock.add(chat(prompt=10, tokens=3))
    clock.run()
    core, clock = engine(per_token_ms=10, context_ms_per_1k=5, kv_blocks=8192)
    long = clock.add(chat(prompt=4000, tokens=3))
    clock.run()
    # each decode step attends ~4,000 tokens: 20 ms more than ~10 tokens
    assert (long.last_token_at - long.first_token_at) - (short.last_token_at - short.first_token_at) == pytest.approx(
        2 * 0.020, abs=0.0002)


def test_steps_back_to_back_keep_their_own_times_when_the_wake_up_is_late():
    core, clock = engine()
    request = clock.add(chat(tokens=5))
    clock.now = 1.0  # woken a second late: the steps due by then ran at their own times
    core.advance(clock.now)
    assert request.state == "finished"
    assert request.first_token_at == pytest.approx(0.01) and request.last_token_at == pytest.approx(0.05)
    assert core.counters.inter_token.sum == pytest.approx(0.04)


def test_a_prompt_that_does_not_fit_waits_with_running_below_capacity():
    core, clock = engine(capacity=8, kv_blocks=100, block_size=16)
    first = clock.add(chat(prompt=1000, tokens=50))  # 63 blocks
    second = clock.add(chat(prompt=1000, tokens=50))
    assert (len(core.running), len(core.waiting)) == (1, 1)
    assert core.snapshot(clock.now).kv_usage == pytest.approx(63 / 100)
    clock.run()
    assert first.state == second.state == "finished"
    assert second.first_scheduled == pytest.approx(first.last_token_at)


def test_out_of_blocks_mid_generation_preempts_the_newest_and_admits_nobody_that_step():
    core, clock = engine(capacity=8, kv_blocks=10, block_size=16, ttft_ms=10, per_token_ms=10)
    old = clock.add(chat(prompt=60, tokens=60))  # 4 blocks, needs 8 by its end
    new = clock.add(chat(prompt=60, tokens=60))
    clock.run_until(0.02)  # the second is admitted when the first's step ends
    assert len(core.running) == 2
    clock.run_until(0.4)
    assert core.counters.preemptions >= 1
    assert new.state == "waiting" and core.waiting[0] is new and new.computed == 0
    assert old.state == "running"
    late = clock.add(chat(prompt=2, tokens=2))
    assert core.waiting[0] is new and core.waiting[-1] is late  # back at the front, ahead of later arrivals
    clock.run()
    assert old.state == new.state == late.state == "finished"
    assert new.generated == 60  # the stream stalled, then carried on


def test_a_deferred_request_counts_as_deferred_only_once_skipped_at_the_head():
    core, clock = engine(capacity=1, ttft_ms=10, per_token_ms=10)
    clock.add(chat(tokens=50))  # fills the batch for 0.5 s
    grammar = clock.add(chat(tokens=2, defer_s=0.3))
    assert core.deferred(clock.now) == 0 and len(core.waiting) == 1  # behind the batch: reason capacity
    core.model = SimModel(name="m", capacity=2, ttft_ms=10, per_token_ms=10)
    clock.run_until(0.1)
    assert core.deferred(clock.now) == 1 and grammar.skipped  # reached, skipped, kept its place
    clock.run_until(0.35)
    assert 0.3 <= grammar.first_scheduled < 0.32 and core.deferred(clock.now) == 0  # at the next step


def test_gauges_show_a_step_after_the_lag_and_stay_stale_after_a_mass_abort():
    core, clock = engine(capacity=4, metrics_lag_s=2.0, ttft_ms=10, per_token_ms=10)
    requests = [clock.add(chat(tokens=1000)) for _ in range(3)]
    assert core.published.at(clock.now, 2.0).running == 0  # nothing old enough yet
    clock.run_until(2.5)
    assert core.published.at(clock.now, 2.0).running == 3
    for request in requests:
        core.abort(request)
    clock.run_until(10.0)
    exact = core.snapshot(clock.now, exact=True)
    assert exact.running == 0 and exact.kv_usage == 0
    assert core.published.at(clock.now, 2.0).running == 3  # no step since: stale
    assert core.counters.aborted == 3 and core.counters.success["abort"] == 0  # aborts are no success
    clock.add(chat(tokens=1))
    clock.run_until(clock.now + 2.1)
    assert core.published.at(clock.now, 2.0).running == 0  # the next step published the truth


def test_the_waiting_gauge_counts_what_a_schedule_left_waiting_not_what_arrived_during_a_step():
    # vLLM's gauge is its scheduler's queue: a request that arrives during a
    # step joins it at the next schedule, which admits it when there is room.
    core, clock = engine(capacity=2, metrics_lag_s=0.0)
    published: list = []
    record = core.published.record
    core.published.record = lambda snapshot, lag: (published.append(snapshot.waiting), record(snapshot, lag))
    clock.add(chat(tokens=100))
    clock.run_until(0.005)  # mid-step
    late = clock.add(chat(tokens=100))
    assert core.snapshot(clock.now, exact=True).waiting == 1  # the exact count sees it at once
    clock.run_until(0.0101)  # the step ends: its snapshot, then the next schedule admits the late one
    assert late.state == "running"
    assert published and max(published) == 0, "published as waiting for capacity the batch had"
    # With the batch full, a schedule leaves the next arrival waiting, and the gauge says so.
    third = clock.add(chat(tokens=100))
    clock.run_until(0.0301)
    assert third.state == "waiting" and core.published.at(clock.now, 0.0).waiting == 1


def test_the_same_inputs_give_the_same_times():
    def times():
        core, clock = engine(capacity=2, kv_blocks=20, distribution="lognormal", sigma=0.5, seed=7)
        requests = [clock.add(chat(prompt=40 * i, tokens=30)) for i in range(1, 5)]
        clock.run()
        return [(r.first_token_at, r.last_token_at) for r in requests], core.counters.preemptions

    assert times() == times()


@settings(max_examples=150, deadline=None)
@given(
    capacity=st.integers(1, 6),
    kv_blocks=st.integers(8, 40),
    events=st.lists(
        st.tuples(st.floats(0, 0.3), st.integers(1, 120), st.integers(1, 40), st.booleans(), st.booleans()),
        min_size=1, max_size=25),
)
def test_any_mix_of_arrivals_and_aborts_keeps_the_books_and_ends_every_request(capacity, kv_blocks, events):
    core, clock = engine(capacity=capacity, kv_blocks=kv_blocks, block_size=8, ttft_ms=5, per_token_ms=5,
                         max_num_batched_tokens=64)
    requests: list[SimRequest] = []

    def check() -> None:
        assert len(core.running) <= capacity
        assert core.used_blocks == sum(r.blocks for r in core.running) <= kv_blocks
        assert all(r.state == "running" for r in core.running) and all(r.state == "waiting" for r in core.waiting)

    for gap, prompt, tokens, fixed, abort_one in events:
        clock.run_until(clock.now + gap)
        check()
        if prompt + tokens <= kv_blocks * 8:  # longer ones are refused before they reach an engine
            request = chat(prompt=prompt, tokens=tokens)
            request.service_s = 0.02 if fixed else None
            requests.append(clock.add(request))
        live = [r for r in requests if not r.done]
        if abort_one and live:
            core.abort(live[len(live) // 2])
        check()
    clock.run()
    check()
    assert not core.running and not core.waiting and core.used_blocks == 0
    assert all(r.state in ("finished", "aborted") for r in requests)
    assert all(r.generated == r.max_tokens for r in requests if r.state == "finished")
    finished = sum(r.state == "finished" for r in requests)
    assert sum(core.counters.success.values()) == finished and core.counters.aborted == len(requests) - finished


def test_a_request_left_waiting_for_a_slot_waited_for_room_one_left_for_the_token_budget_did_not():
    # The control benchmark tells over-admission (a width above what the engine runs) from the
    # engine's own pacing of prompts (a step's token budget), which any width meets.
    core, clock = engine(capacity=1, metrics_lag_s=0.0)
    first, second = chat(tokens=3), chat(tokens=3)
    core.add(first)
    clock.add(second)
    clock.run()
    assert first.state == second.state == "finished"
    assert (first.left_waiting, first.waited_for_room) == (False, False)
    assert (second.left_waiting, second.waited_for_room) == (True, True)  # the batch of 1 was full

    core, clock = engine(capacity=8, max_num_batched_tokens=100, metrics_lag_s=0.0)
    first, second = chat(prompt=100, tokens=3), chat(prompt=100, tokens=3)
    core.add(first)
    clock.add(second)
    clock.run()
    assert first.state == second.state == "finished"
    assert (second.left_waiting, second.waited_for_room) == (True, False)  # the budget, renewed next step


def test_a_preempted_request_waited_for_room():
    core, clock = engine(capacity=8, kv_blocks=10, block_size=16, ttft_ms=10, per_token_ms=10)
    old = clock.add(chat(prompt=60, tokens=60))  # 4 blocks, needs 8 by its end
    new = clock.add(chat(prompt=60, tokens=60))
    clock.run()
    assert core.counters.preemptions >= 1
    assert new.waited_for_room and not old.waited_for_room

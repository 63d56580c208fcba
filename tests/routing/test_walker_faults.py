"""The walker against real parts when time, breakers and Redis misbehave.

Real Redis (the session's embedded server, private to the test run, so it may
be paused), a SQLite catalog and the HTTP simulator; no Celery here.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis

from lanes import DeadlineExpired, Priority
from lanes.catalog import apply_document, load_routing, open_catalog
from lanes.routing.breaker import BreakerPolicy
from lanes.routing.observers import BaseObserver
from lanes.routing.request import RouteRequest
from lanes.routing.runtime import Runtime, provision_lanes
from lanes.routing.walker import RequeueRequested, Walker
from lanes.sim import SimModel, Simulator
from tests.polling import eventually

CHAT = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def sim():
    models = [
        SimModel(name="m1", capacity=8, service_ms=5.0),
        SimModel(name="m2", capacity=8, service_ms=5.0),
        SimModel(name="slow", capacity=8, service_ms=1500.0),
    ]
    with Simulator(models, port=0) as server:
        yield server


@pytest.fixture
def build(make_settings, one_redis_url, sim):
    """A runtime over a catalog of two pools (m1 on p1, m2 on p2, slow on p3)."""
    made = []

    def make(*, reserve_ms=1000, m1_timeout_ms=60_000, m2_timeout_ms=60_000, consecutive=5, **settings):
        sim.reset(config=True)
        settings = make_settings(redis_url=one_redis_url, **settings)
        engine = open_catalog(settings)
        apply_document(engine, {
            "pools": [{"name": "p1", "width": 1}, {"name": "p2", "width": 1}, {"name": "p3", "width": 1}],
            "models": [
                {"name": "m1", "base_url": sim.base_url, "pool": "p1", "timeout_ms": m1_timeout_ms},
                {"name": "m2", "base_url": sim.base_url, "pool": "p2", "timeout_ms": m2_timeout_ms},
                {"name": "slow", "base_url": sim.base_url, "pool": "p3"},
            ],
            "workflows": [
                {"name": "chat", "priority": "interactive", "reserve_ms": reserve_ms, "candidates": ["m1", "m2"]},
                {"name": "solo", "priority": "interactive", "candidates": ["m1"]},
                {"name": "slow_chat", "priority": "interactive", "candidates": ["slow"]},
            ],
        })
        provision_lanes(redis.Redis.from_url(one_redis_url), settings, load_routing(engine))
        rt = Runtime(settings, redis_url=one_redis_url, engine=engine)
        rt.breakers.policy = BreakerPolicy(consecutive=consecutive, cooldown_seconds=0.2)
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.close()


class Recorder(BaseObserver):
    def __init__(self) -> None:
        self.attempts, self.bypasses = [], []

    def on_attempt(self, attempt) -> None:
        self.attempts.append(attempt)

    def on_bypass(self, bypass) -> None:
        self.bypasses.append(bypass)


def request(workflow="chat", *, deadline_in=None, submitted_ago=0.0, priority=Priority.INTERACTIVE):
    now = time.time()
    return RouteRequest(
        task_id=f"t-{time.monotonic_ns()}", workflow=workflow, payload=CHAT, priority=priority,
        deadline=None if deadline_in is None else now + deadline_in, submitted_at=now - submitted_ago,
    )


def calls(sim, model):
    s = sim.stats()[model]
    return s["served"] + s["failed"] + s["rejected"] + s["cancelled"] + s["in_flight"]


def window(rt, model):
    """The breaker's recorded outcomes for ``model`` ('1' failure, '0' success)."""
    state, outcomes = rt.breakers._keys(model)
    return [x.decode() for x in rt.client.lrange(outcomes, 0, -1)]


# --- observers ---------------------------------------------------------------------


def test_every_call_and_bypass_reaches_each_observer_with_the_generation_of_its_admission(build):
    rt = build()
    seen = Recorder()
    rt.observers.append(seen)
    asked = []
    rt.control_generation = lambda pool: asked.append(pool.name) or 7
    result = Walker(rt).walk(request(deadline_in=30))
    assert result.trace.served_by == "m1"
    [attempt] = seen.attempts
    assert (attempt.model, attempt.pool, attempt.outcome, attempt.generation) == ("m1", "p1", "served", 7)
    assert attempt.task_id == result.trace.task_id and attempt.wait_seconds is not None
    assert asked == ["p1"]
    assert window(rt, "m1") == ["0"]  # the breaker listens among the observers


def test_an_observer_that_fails_loses_neither_the_answer_nor_the_other_reports(build):
    rt = build()

    class Broken(BaseObserver):
        def on_attempt(self, attempt):
            raise RuntimeError("metrics backend down")

    seen = Recorder()
    rt.observers[:0] = [Broken()]
    rt.observers.append(seen)
    assert Walker(rt).walk(request(deadline_in=30)).trace.served_by == "m1"
    assert [a.outcome for a in seen.attempts] == ["served"]


# --- 15.1: time that ran out on our side --------------------------------------------


def test_a_task_past_its_deadline_fails_fast_and_never_feeds_a_breaker(build, sim):
    rt = build(consecutive=1)
    seen = Recorder()
    rt.observers.append(seen)
    for _ in range(5):
        stale = request("solo", deadline_in=-1.0, submitted_ago=31.0)
        walker = Walker(rt)
        with pytest.raises(DeadlineExpired, match="before routing began"):
            walker.walk(stale)
        assert walker.trace.outcome == "expired"
    assert seen.attempts == [] and calls(sim, "m1") == 0
    assert rt.breakers.state("m1") == "closed" and window(rt, "m1") == []
    # A fresh request still goes to the primary.
    assert Walker(rt).walk(request(deadline_in=30)).trace.served_by == "m1"


def test_a_deadline_that_passes_in_the_lane_is_not_the_backends_fault(build, sim):
    rt = build(consecutive=1)
    lane = rt.lane(rt.table().pools["p1"])
    hold = lane.acquire(Priority.INTERACTIVE, timeout=5)
    threading.Timer(1.0, hold.release).start()
    walker = Walker(rt)
    # The last (only) candidate waits up to the deadline; the slot comes just after it.
    with pytest.raises(Exception) as failure:
        walker.walk(request("solo", deadline_in=0.8))
    assert type(failure.value).__name__ in ("CapacityWaitTimeout", "DeadlineExpired")
    assert calls(sim, "m1") == 0
    assert window(rt, "m1") == [] and rt.breakers.state("m1") == "closed"


# --- 15.7: a Redis blip after a successful call -----------------------------------------


def test_a_redis_blip_after_a_successful_call_keeps_the_answer(build, sim, one_redis_url):
    rt = build(redis_timeout_seconds=0.3, lease_seconds=30)
    admin = redis.Redis.from_url(one_redis_url)
    walker = Walker(rt)
    outcome = {}
    walk = threading.Thread(target=lambda: outcome.setdefault("result", walker.walk(request("slow_chat"))))
    walk.start()
    eventually(lambda: sim.stats()["slow"]["in_flight"] == 1, what="the slow call to start")
    # Redis stops answering writes while the backend works, and after it answered.
    admin.execute_command("CLIENT", "PAUSE", 3000, "WRITE")
    try:
        walk.join(20)
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    assert outcome["result"].trace.served_by == "slow"
    assert calls(sim, "slow") == 1


# --- 15.8: the half-open trial -------------------------------------------------------------


def test_a_bypass_never_burns_the_half_open_trial(build, sim):
    rt = build(reserve_ms=2000, consecutive=1)
    rt.breakers.record("m1", ok=False)
    eventually(lambda: rt.breakers.state("m1") == "half_open", what="the cool-down")
    lane = rt.lane(rt.table().pools["p1"])
    with lane.acquire(Priority.INTERACTIVE, timeout=5):
        # m1 is busy and the budget is spent: passed over, without calling.
        result = Walker(rt).walk(request(deadline_in=1.5))
    assert result.trace.served_by == "m2"
    assert [s["reason"] for s in result.trace.steps if s["action"] == "bypass"] == ["budget_spent"]
    assert rt.breakers.state("m1") == "half_open"  # the trial is still there to take
    trial = Walker(rt).walk(request(deadline_in=30))
    assert trial.trace.served_by == "m1" and calls(sim, "m1") == 1
    assert rt.breakers.state("m1") == "closed"


def test_a_trial_spent_on_a_refused_request_is_given_back(build, sim):
    rt = build(consecutive=1)
    rt.breakers.record("m1", ok=False)
    eventually(lambda: rt.breakers.state("m1") == "half_open", what="the cool-down")
    sim.configure("m1", fail_next=1, fail_status=400)
    with pytest.raises(Exception, match="400"):
        Walker(rt).walk(request(deadline_in=30))
    assert rt.breakers.state("m1") == "half_open"  # a 400 says nothing about m1's health


# --- issue 10.2: a free slot costs no waiting ------------------------------------------------


def test_an_idle_primary_is_used_even_when_the_budget_is_spent(build, sim):
    rt = build(reserve_ms=30_000)
    # The README's example: deadline 30 s on a workflow that keeps 30 s for its fallbacks.
    result = Walker(rt).walk(request(deadline_in=30))
    assert result.trace.served_by == "m1"
    assert calls(sim, "m2") == 0


def test_a_busy_primary_with_its_budget_spent_is_still_passed_over(build, sim):
    rt = build(reserve_ms=30_000)
    lane = rt.lane(rt.table().pools["p1"])
    with lane.acquire(Priority.INTERACTIVE, timeout=5):
        result = Walker(rt).walk(request(deadline_in=30))
    assert result.trace.served_by == "m2"
    assert [(s["action"], s.get("reason")) for s in result.trace.steps] == [("bypass", "budget_spent"), ("served", None)]


# --- issue 10.3: a hung call gives the fallback its time ---------------------------------------


def test_a_hung_primary_is_abandoned_in_time_for_the_fallback(build, sim):
    rt = build(reserve_ms=3000, consecutive=1)
    sim.configure("m1", hang_next=1, hang_s=60.0)
    result = Walker(rt).walk(request(deadline_in=6))
    assert result.trace.served_by == "m2"
    first = result.trace.steps[0]
    assert (first["model"], first["action"]) == ("m1", "abandoned")
    assert "no first token" in first["reason"]
    # Abandoned at the request's own cap (deadline - reserve): not m1's fault.
    assert window(rt, "m1") == [] and rt.breakers.state("m1") == "closed"
    assert rt.lane(rt.table().pools["p1"]).stats().in_flight == 0  # its slot came back
    [event] = eventually(lambda: rt.events.list(kind="call_abandoned"), what="the call_abandoned event")
    assert (event.pool, event.detail["model"], event.detail["outcome"]) == ("p1", "m1", "abandoned")


def test_a_call_past_the_models_own_first_token_timeout_counts_against_it(build, sim):
    rt = build(reserve_ms=1000, m1_timeout_ms=1000, consecutive=1)
    sim.configure("m1", hang_next=1, hang_s=60.0)
    result = Walker(rt).walk(request(deadline_in=30))
    assert result.trace.served_by == "m2"
    assert result.trace.steps[0]["action"] == "timeout"
    assert window(rt, "m1") == ["1"] and rt.breakers.state("m1") == "open"
    events = eventually(lambda: rt.events.list(kind="call_abandoned"), what="the call_abandoned event")
    assert [e.detail["outcome"] for e in events] == ["timeout"]


# --- 15.2: the whole walk fits below the visibility timeout ----------------------------------


def budget_runtime(build, sim):
    # Visibility 60 s: a walk may spend 30 s from delivery on waits and calls.
    rt = build(visibility_timeout_seconds=60, m1_timeout_ms=5_000, m2_timeout_ms=10_000, reserve_ms=0)
    return rt


def test_a_call_that_cannot_fit_in_what_is_left_of_the_delivery_is_requeued_uncalled(build, sim):
    rt = budget_runtime(build, sim)
    walker = Walker(rt)
    with pytest.raises(RequeueRequested) as requeued:
        # Delivered 27 s ago: 3 s left, m1 may take 5 s.
        walker.walk(request(deadline_in=120), delivered_at=time.time() - 27)
    assert requeued.value.called == ()
    assert calls(sim, "m1") == 0 and calls(sim, "m2") == 0


def test_a_requeue_names_the_candidates_already_called_and_the_next_delivery_skips_them(build, sim):
    rt = budget_runtime(build, sim)
    sim.configure("m1", fail_next=1, fail_status=500)
    walker = Walker(rt)
    with pytest.raises(RequeueRequested) as requeued:
        # 8 s left: m1 (5 s) fits and fails; m2 (10 s) cannot fit after it.
        walker.walk(request(deadline_in=120), delivered_at=time.time() - 22)
    assert requeued.value.called == ("m1",)
    assert calls(sim, "m1") == 1 and calls(sim, "m2") == 0
    again = request(deadline_in=120)
    again = RouteRequest(**{**again.__dict__, "called": requeued.value.called})
    result = Walker(rt).walk(again, delivered_at=time.time())
    assert result.trace.served_by == "m2"
    assert calls(sim, "m1") == 1  # not called a second time for the task


def test_a_wait_is_cut_short_so_the_call_after_it_still_fits(build, sim):
    rt = budget_runtime(build, sim)
    lane = rt.lane(rt.table().pools["p1"])
    with lane.acquire(Priority.INTERACTIVE, timeout=5):
        with pytest.raises(RequeueRequested):
            # 6.5 s left, m1's call needs 5 s: at most 1.5 s of waiting, then requeue.
            Walker(rt).walk(request("solo"), delivered_at=time.time() - 23.5)
    assert calls(sim, "m1") == 0

"""The walker in-process against real parts: Redis lanes, a SQLite catalog, the simulator.

No Celery here: these are the budget rules of the walker itself.
"""

import threading
import time

import pytest
import redis

from lanes import AcquireCancelled, CapacityWaitTimeout, Priority
from lanes.catalog import apply_document, load_routing, open_catalog
from lanes.routing.request import RouteRequest
from lanes.routing.runtime import Runtime, provision_lanes
from lanes.routing.walker import Walker
from lanes.sim import SimModel, Simulator

CHAT = {"messages": [{"role": "user", "content": "x"}]}


@pytest.fixture(scope="module")
def sim():
    with Simulator([SimModel(name="m", capacity=4, service_ms=5.0)], port=0) as server:
        yield server


@pytest.fixture
def runtime(make_settings, one_redis_url, sim):
    settings = make_settings(redis_url=one_redis_url, admission_cap_seconds=0.5)
    engine = open_catalog(settings)
    apply_document(engine, {
        "pools": [{"name": "p", "width": 1}],
        "models": [{"name": "m", "base_url": sim.base_url, "pool": "p"}],
        "workflows": [
            {"name": "chat", "priority": "interactive", "candidates": ["m"]},
            {"name": "memory", "priority": "background", "candidates": ["m"]},
        ],
    })
    provision_lanes(redis.Redis.from_url(one_redis_url), settings, load_routing(engine))
    rt = Runtime(settings, redis_url=one_redis_url, engine=engine)
    yield rt
    rt.close()


def request(workflow, priority, deadline=None):
    return RouteRequest(task_id=f"t-{time.monotonic_ns()}", workflow=workflow, payload=CHAT, priority=priority,
                        deadline=deadline, submitted_at=time.time())


def test_a_request_without_a_deadline_stops_waiting_at_the_lane_cap(runtime):
    lane = runtime.lane(runtime.table().pools["p"])
    with lane.acquire(Priority.INTERACTIVE, timeout=5):
        walker = Walker(runtime)
        with pytest.raises(CapacityWaitTimeout, match="capacity_wait_timeout"):
            walker.walk(request("chat", Priority.INTERACTIVE))
    assert walker.trace.outcome == "capacity_timeout"
    assert [s["action"] for s in walker.trace.steps] == ["wait_timeout"]


def test_background_work_without_a_deadline_waits_past_the_lane_cap(runtime):
    lane = runtime.lane(runtime.table().pools["p"])
    hold = lane.acquire(Priority.INTERACTIVE, timeout=5)
    threading.Timer(1.5, hold.release).start()  # three times the 0.5 s cap
    result = Walker(runtime).walk(request("memory", Priority.BACKGROUND))
    assert result.trace.outcome == "served"
    assert result.trace.steps[-1]["wait_ms"] >= 1000


def test_a_caller_may_lower_a_workflows_priority(runtime):
    lane = runtime.lane(runtime.table().pools["p"])
    hold = lane.acquire(Priority.INTERACTIVE, timeout=5)
    results = {}

    def walk(name, priority):
        results[name] = Walker(runtime).walk(request("chat", priority, deadline=time.time() + 30))

    lowered = threading.Thread(target=walk, args=("lowered", Priority.BACKGROUND))
    lowered.start()
    deadline = time.monotonic() + 5
    while lane.stats().queued[Priority.BACKGROUND] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    urgent = threading.Thread(target=walk, args=("urgent", Priority.INTERACTIVE))
    urgent.start()
    while lane.stats().queued[Priority.INTERACTIVE] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    hold.release()
    lowered.join(10)
    urgent.join(10)
    # The later interactive request went ahead of the earlier, lowered one.
    assert results["urgent"].trace.steps[-1]["admitted_at"] < results["lowered"].trace.steps[-1]["admitted_at"]


def test_the_walker_waits_in_the_lane_as_the_tasks_workflow(runtime):
    # The lane's share per workflow (issue 14) needs the task's workflow name.
    lane = runtime.lane(runtime.table().pools["p"])
    hold = lane.acquire(Priority.INTERACTIVE, timeout=5)
    results = {}
    walking = threading.Thread(target=lambda: results.setdefault(
        "r", Walker(runtime).walk(request("chat", Priority.INTERACTIVE, deadline=time.time() + 30))))
    walking.start()
    deadline = time.monotonic() + 5
    while lane.stats().queued[Priority.INTERACTIVE] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    books = {(w.priority, w.workflow): w for w in lane.stats().workflows}
    hold.release()
    walking.join(10)
    assert books[(Priority.INTERACTIVE, "chat")].waiting == 1
    assert books[(Priority.INTERACTIVE, "")].in_flight == 1  # the test's own holder: the anonymous workflow
    assert results["r"].trace.outcome == "served"


def test_a_background_slot_asked_back_before_its_call_goes_to_urgent_work_at_once_and_nothing_is_sent(
        runtime, sim, monkeypatch):
    # The background walk holds its slot but is held between its grant and
    # its call (in the breaker claim). An urgent walk asks for the slot: it
    # must get it without that thread's help (the lane cap is 0.5 s here,
    # and the thread is held until the urgent walk is over), and the
    # background walk, once let go, sends nothing on that slot: it waits
    # again and is served once.
    held, go = threading.Event(), threading.Event()
    claim = runtime.breakers.claim

    def held_claim(name, **kwargs):
        if threading.current_thread().name == "background" and not go.is_set():
            held.set()
            go.wait(10)
        return claim(name, **kwargs)

    monkeypatch.setattr(runtime.breakers, "claim", held_claim)
    sent = sim.stats()["m"]["served"]
    results = {}
    background = threading.Thread(
        target=lambda: results.setdefault("background", Walker(runtime).walk(request("memory", Priority.BACKGROUND))),
        name="background")
    background.start()
    try:
        assert held.wait(5), "the background walk never reached its call"
        urgent = Walker(runtime).walk(request("chat", Priority.INTERACTIVE))
    finally:
        go.set()
        background.join(10)
    assert urgent.trace.outcome == "served"
    assert urgent.trace.steps[-1].get("asked_yield") is True, "the urgent step says it took a background slot"
    steps = results["background"].trace.steps
    assert [s["action"] for s in steps] == ["yielded", "served"]
    assert not any(s.get("asked_yield") for s in steps)
    assert steps[0]["call_ms"] < 1000
    assert sim.stats()["m"]["served"] == sent + 2
    assert sim.stats()["m"]["cancelled"] == 0, "nothing was cut at the backend: nothing had been sent"


def test_a_walk_cancelled_as_its_slot_is_granted_gives_the_slot_back_unused(runtime, sim, monkeypatch):
    # A revoke whose broadcast lands between the grant and the call: the
    # backend is not called and the slot is free again at once.
    lane = runtime.lane(runtime.table().pools["p"])
    cancel = threading.Event()
    acquire = lane.acquire

    def granted_then_cancelled(*args, **kwargs):
        permit = acquire(*args, **kwargs)
        cancel.set()
        return permit

    monkeypatch.setattr(lane, "acquire", granted_then_cancelled)
    served = sim.stats()["m"]["served"]
    walker = Walker(runtime)
    with pytest.raises(AcquireCancelled, match="went back unused"):
        walker.walk(request("chat", Priority.INTERACTIVE, deadline=time.time() + 30), cancel=cancel)
    assert walker.trace.outcome == "cancelled"
    assert walker.called == []
    assert sim.stats()["m"]["served"] == served
    assert lane.stats().in_flight == 0

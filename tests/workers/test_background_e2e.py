"""Background work fills the lane, urgent work never waits behind it.

Real parts: a supervised fleet worker process, Redis, the HTTP simulator.
The simulator at capacity 0 holds every call it gets, so each test reads the
system at rest: the calls the backend holds, the waiters parked in the lane,
the messages left in the Celery queue. Counts and orders only, no durations.
"""

from __future__ import annotations

import json

import pytest
import redis

from lanes import Priority
from lanes.sim import SimModel
from tests.e2e.harness import deploy
from tests.polling import eventually

# One test here is the feature's end-to-end path in the fast tier; the rest are slow.
pytestmark = [pytest.mark.timeout(240)]

CHAT = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}


def document(width: int) -> dict:
    return {
        "pools": [{"name": "gpu", "width": width, "ceiling": 8}],
        "models": [{"name": "m", "base_url": "{sim}", "pool": "gpu", "timeout_ms": 120_000}],
        "workflows": [
            {"name": "memory", "priority": "background", "candidates": ["m"]},
            {"name": "dialog", "priority": "interactive", "candidates": ["m"]},
        ],
    }


@pytest.fixture
def make_fleet(tmp_path, embedded_redis):
    """A fleet for one pool of the given width; the simulator's model holds every call."""
    made = []

    def build(width: int):
        url = embedded_redis.url.rsplit("/", 1)[0] + "/5"
        redis.Redis.from_url(url).flushdb()
        # Each process holds two messages a slot (the threads pool's own
        # sizing; the gevent pool's bound), so what waits beyond them waits in
        # Celery's queue, where these tests watch it.
        dep = deploy(tmp_path, url, json.loads(json.dumps(document(width))),
                     [SimModel(name="m", capacity=0, service_ms=50.0)], ["gpu"], fleet_held_messages=2 * width)
        made.append(dep)
        return dep

    yield build
    for dep in made:
        dep.close()


def backend(dep) -> dict:
    return dep.sim.stats()["m"]


def parked(dep, priority: Priority) -> int:
    if not hasattr(dep, "gpu_lane"):
        dep.gpu_lane = dep.lane("gpu")  # one client for every poll, not one per read
    return dep.gpu_lane.stats().queued[priority]


def release_calls(dep, count: int) -> None:
    """Let exactly ``count`` held calls run: the model admits them, then holds again."""
    dep.sim.configure("m", capacity=count)
    dep.sim.configure("m", capacity=0)


def admitted_at(result) -> float:
    report = result.get(timeout=60)
    return report["trace"]["steps"][-1]["admitted_at"]


@pytest.mark.parametrize(("workflow", "priority"), [("memory", None), ("dialog", "background")],
                         ids=["native-background", "caller-lowered"])
@pytest.mark.slow
def test_a_background_backlog_keeps_the_backend_at_its_width(make_fleet, workflow, priority):
    width = 2
    dep = make_fleet(width)
    backlog = [dep.client.submit(workflow, CHAT, priority=priority) for _ in range(6 * width)]
    for served in range(0, 3 * width + 1, width):
        # At rest after each round: the backend holds a call per slot, and
        # a background task is parked in the lane for each slot, ready to
        # take it the moment it frees; the rest of the backlog waits in Celery.
        eventually(lambda: backend(dep)["served"] == served and backend(dep)["in_flight"] == width
                   and parked(dep, Priority.BACKGROUND) == width, timeout=30, interval=0.05,
                   what=f"{width} calls held and {width} background waiters after {served} served")
        release_calls(dep, width)
    assert backend(dep)["max_in_flight"] == width  # never over-admitted
    dep.sim.configure("m", capacity=width)
    for result in backlog:
        assert result.get(timeout=60)["model"] == "m"
    assert backend(dep)["served"] == len(backlog)
    # Served in the order submitted: a task can only be overtaken by the few
    # delivered to other threads while it was on its way into the lane,
    # never by the whole queue (nothing is handed back to its tail).
    order = sorted(range(len(backlog)), key=lambda index: admitted_at(backlog[index]))
    assert max(abs(rank - index) for rank, index in enumerate(order)) < 2 * width


@pytest.mark.end_to_end
@pytest.mark.parametrize("width", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_interactive_requests_up_to_the_width_go_ahead_of_parked_background_work(make_fleet, width):
    dep = make_fleet(width)
    # Interactive work holds every slot; background work parks behind it.
    first = [dep.client.submit("dialog", CHAT) for _ in range(width)]
    eventually(lambda: backend(dep)["in_flight"] == width, timeout=30, interval=0.05,
               what="the first interactive calls")
    background = [dep.client.submit("memory", CHAT) for _ in range(3 * width)]
    eventually(lambda: parked(dep, Priority.BACKGROUND) >= width, timeout=30, interval=0.05, what="background waiters")
    # A second wave of interactive requests, as many as the width: each must
    # reach the lane (a worker thread each), not wait in the Celery queue.
    second = [dep.client.submit("dialog", CHAT) for _ in range(width)]
    eventually(lambda: parked(dep, Priority.INTERACTIVE) == width, timeout=30, interval=0.05,
               what=f"{width} interactive waiters in the lane")
    dep.sim.configure("m", capacity=width)
    for result in first + second + background:
        assert result.get(timeout=60)["model"] == "m"
    last_urgent = max(admitted_at(r) for r in second)
    first_background = min(admitted_at(r) for r in background)
    assert last_urgent < first_background
    assert backend(dep)["max_in_flight"] == width


@pytest.mark.slow
@pytest.mark.parametrize("width", [1, 2])
def test_an_interactive_request_on_a_full_background_lane_takes_a_background_slot(make_fleet, width):
    dep = make_fleet(width)
    # Background calls hold every slot (the backend holds them), more park behind.
    background = [dep.client.submit("memory", CHAT) for _ in range(3 * width)]
    eventually(lambda: backend(dep)["in_flight"] == width and parked(dep, Priority.BACKGROUND) >= width,
               timeout=30, interval=0.05, what="background calls held and background waiters")
    urgent = dep.client.submit("dialog", CHAT)
    # The newest background call is cut short (the backend sees its client
    # leave) and its slot goes to the interactive request: the backend holds
    # the width again, and nothing interactive is left waiting in the lane.
    eventually(lambda: backend(dep)["cancelled"] == 1 and backend(dep)["in_flight"] == width
               and parked(dep, Priority.INTERACTIVE) == 0, timeout=30, interval=0.05,
               what="one background call given up for the interactive one")
    assert backend(dep)["max_in_flight"] == width  # the slot changed hands, never doubled
    # One call at a time from here, so the lane's grants are apart in time
    # and the admission times below keep the lane's order.
    dep.sim.configure("m", capacity=1)
    assert urgent.get(timeout=60)["model"] == "m"
    reports = [result.get(timeout=60) for result in background]
    assert all(report["model"] == "m" for report in reports)
    assert backend(dep)["served"] == len(background) + 1 and backend(dep)["max_in_flight"] == width
    yielded = [index for index, report in enumerate(reports)
               if any(step["action"] == "yielded" for step in report["trace"]["steps"])]
    assert len(yielded) == 1
    # It waited again ahead of the background work parked behind it: only
    # the holders it was admitted with can come before it.
    order = sorted(range(len(background)), key=lambda index: admitted_at(background[index]))
    assert order.index(yielded[0]) <= width - 1


@pytest.mark.slow
def test_slots_handed_over_again_and_again_never_double_the_backend(make_fleet):
    # Each round: two background calls hold the lane, two interactive
    # requests take their slots by cutting them short. The new call is sent
    # right after the cut; the backend must have let the cut one go first.
    width, rounds = 2, 8
    dep = make_fleet(width)
    handed_over = 0
    for _ in range(rounds):
        dep.sim.configure("m", capacity=0)
        background = [dep.client.submit("memory", CHAT) for _ in range(width)]
        eventually(lambda: backend(dep)["in_flight"] == width, timeout=30, interval=0.02,
                   what="background calls held")
        cancelled = backend(dep)["cancelled"]
        urgent = [dep.client.submit("dialog", CHAT) for _ in range(width)]
        eventually(lambda: backend(dep)["cancelled"] == cancelled + width and backend(dep)["in_flight"] == width,
                   timeout=30, interval=0.02, what="every background call given up for an interactive one")
        handed_over += width
        assert backend(dep)["max_in_flight"] == width, f"over width after {handed_over} hand-overs"
        dep.sim.configure("m", capacity=2 * width)
        for result in urgent + background:
            assert result.get(timeout=60)["model"] == "m"
    assert backend(dep)["cancelled"] == handed_over and backend(dep)["max_in_flight"] == width

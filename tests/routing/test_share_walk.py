"""The walker with the failover share and the capacity caps, in-process against real parts:
Redis lanes, a SQLite catalog, the HTTP simulator. No Celery here (see tests/e2e/test_shares_e2e.py).
"""

from __future__ import annotations

import time

import pytest
import redis

from lanes import CapacityWaitTimeout, Priority
from lanes.catalog import apply_document, load_routing, open_catalog
from lanes.routing.observers import Attempt
from lanes.routing.request import RouteRequest
from lanes.routing.runtime import Runtime, provision_lanes
from lanes.routing.walker import Walker
from lanes.sim import SimModel, Simulator

CHAT = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}


class Always:
    """A draw that always comes out the same way (``random()`` returns ``value``)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.fixture(scope="module")
def sim():
    models = [SimModel(name=n, capacity=4, service_ms=5.0) for n in ("m", "n", "o")]
    with Simulator(models, port=0) as server:
        yield server


@pytest.fixture
def runtime(request, make_settings, one_redis_url, sim):
    # The admission cap (and the "reserved" workflow's reserve with it): 1 s
    # unless a test asks for a longer one (indirect parametrization).
    cap = getattr(request, "param", 1.0)
    settings = make_settings(redis_url=one_redis_url, admission_cap_seconds=cap)
    engine = open_catalog(settings)
    apply_document(engine, {
        "pools": [{"name": "p", "width": 1}, {"name": "q", "width": 1}],
        "models": [{"name": "m", "base_url": sim.base_url, "pool": "p"},
                   {"name": "n", "base_url": sim.base_url, "pool": "q"},
                   {"name": "o", "base_url": sim.base_url}],
        "workflows": [
            {"name": "shared", "candidates": ["m", "n"]},
            {"name": "plain", "candidates": ["m", "n"], "failover": {"enabled": False}},
            {"name": "reserved", "reserve_ms": int(600 * cap), "candidates": ["m", "o"]},
            {"name": "alone", "candidates": ["m"]},
        ],
    })
    provision_lanes(redis.Redis.from_url(one_redis_url), settings, load_routing(engine))
    rt = Runtime(settings, redis_url=one_redis_url, engine=engine)
    yield rt
    sim.reset(config=True)
    rt.close()


def request(workflow: str) -> RouteRequest:
    return RouteRequest(task_id=f"t-{time.monotonic_ns()}", workflow=workflow, payload=CHAT,
                        priority=Priority.INTERACTIVE, deadline=None, submitted_at=time.time())


def steps(walker: Walker) -> list[tuple[str, str]]:
    return [(s["model"], s["action"]) for s in walker.trace.steps]


def demote(runtime: Runtime, workflow: str) -> float:
    """Cut the workflow's share once, as 20 slow first tokens on its primary would."""
    route = runtime.workflow(workflow)
    generation = runtime.shares.choose(route).generation
    for _ in range(20):
        runtime.shares.observe(route, Attempt(workflow=workflow, model="m", pool="p", pool_id=None,
                                              priority=Priority.INTERACTIVE, outcome="served", ttft_seconds=30.0,
                                              share_generation=generation))
    return runtime.shares.store.read(workflow).share


def test_a_request_that_draws_past_the_primary_starts_at_the_next_candidate(runtime):
    assert demote(runtime, "shared") == pytest.approx(0.8)
    runtime.shares.rng = Always(0.9)  # above the share: not the primary first
    walker = Walker(runtime)
    assert walker.walk(request("shared")).trace.served_by == "n"
    assert steps(walker) == [("m", "share_skip"), ("n", "served")]
    runtime.shares.rng = Always(0.1)  # below it: the primary first, as always
    walker = Walker(runtime)
    walker.walk(request("shared"))
    assert steps(walker) == [("m", "served")]


def test_the_primary_stays_reachable_after_the_next_candidate_and_its_attempt_counts(runtime, sim):
    demote(runtime, "shared")
    runtime.shares.rng = Always(0.9)
    sim.configure("n", fail_rate=1.0, fail_status=500)
    before = runtime.shares.store.read("shared").samples
    walker = Walker(runtime)
    assert walker.walk(request("shared")).trace.served_by == "m"
    assert steps(walker) == [("m", "share_skip"), ("n", "failed"), ("m", "served")]
    # The primary's attempt fed its window, wherever it came in the walk.
    assert runtime.shares.store.read("shared").samples == before + 1


def test_a_workflow_with_the_share_off_or_one_candidate_always_starts_at_its_primary(runtime):
    runtime.shares.rng = Always(0.999)
    for workflow in ("plain", "alone"):
        walker = Walker(runtime)
        walker.walk(request(workflow))
        assert steps(walker) == [("m", "served")]
        assert runtime.shares.store.read(workflow) is None


@pytest.mark.parametrize("runtime", [10.0], indirect=True)
def test_without_a_deadline_the_next_candidate_is_tried_at_the_cap_minus_its_reserve(runtime):
    """The admission cap (10 s here, 300 s by default) less the 6 s reserve: 4 s on m.
    Scaled up from 1 s and 600 ms so that a busy machine's delays (hundreds of
    milliseconds) cannot blur "at the cap less the reserve" into "at the cap"."""
    lane = runtime.lane(runtime.table().pools["p"])
    with lane.acquire(Priority.INTERACTIVE, timeout=5):
        walker = Walker(runtime)
        result = walker.walk(request("reserved"))
    assert result.trace.served_by == "o"
    assert steps(walker) == [("m", "wait_timeout"), ("o", "served")]
    waited = walker.trace.steps[0]["wait_ms"]
    assert 3_000 <= waited < 9_000


def test_the_last_candidate_ends_with_the_retryable_capacity_timeout_at_the_cap(runtime):
    lane = runtime.lane(runtime.table().pools["p"])
    with lane.acquire(Priority.INTERACTIVE, timeout=5):
        walker = Walker(runtime)
        with pytest.raises(CapacityWaitTimeout, match="capacity_wait_timeout") as failure:
            walker.walk(request("alone"))
    assert failure.value.retryable
    assert walker.trace.steps[0]["wait_ms"] >= 900


def test_while_the_breaker_keeps_the_primary_from_being_tried_the_share_neither_learns_nor_recovers(runtime):
    from lanes.clock import ManualClock
    from lanes.routing.breaker import BreakerPolicy

    # Given a share cut once, then the primary's breaker opened (a long cooldown: it stays open)
    clock = ManualClock()
    runtime.shares.clock = clock
    assert demote(runtime, "shared") == pytest.approx(0.8)
    runtime.breakers.policy = BreakerPolicy(cooldown_seconds=3600.0)
    for _ in range(5):
        runtime.breakers.record("m", ok=False)
    assert runtime.breakers.state("m") == "open"
    runtime.shares.rng = Always(0.1)  # every request draws the primary first
    idle = runtime.workflow("shared").failover.idle_recovery_ms / 1000

    # When requests keep coming for three idle-recovery intervals
    served_by = []
    for _ in range(12):
        clock.advance(idle / 4)
        walker = Walker(runtime)
        served_by.append(walker.walk(request("shared")).trace.served_by)
        assert steps(walker) == [("m", "bypass"), ("n", "served")]
        assert walker.trace.steps[0]["reason"] == "breaker_open"

    # Then every one went to the fallback, and the share says so: held, not recovering
    assert served_by == ["n"] * 12
    state = runtime.shares.store.read("shared")
    assert state.share == pytest.approx(0.8) and state.samples == 0
    assert state.decision == "held" and state.held_at is not None
    runtime.events.flush()
    changes = [e.detail["change"] for e in runtime.events.list(kind="share_change")]
    assert "idle_recovery" not in changes and changes.count("held") == 1, changes

    # Once the breaker no longer holds the primary back, idle recovery counts from the last hold
    clock.advance(idle + 1)
    assert runtime.shares.choose(runtime.workflow("shared")).share == pytest.approx(0.85)

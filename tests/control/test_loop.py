"""The control loop and the width authority against a real Redis and a real catalog.

Time is a ManualClock; the lane, the lease, the reports and the commits are
the real scripts.
"""

from __future__ import annotations

import json

import pytest

from lanes.catalog import apply_document, open_catalog
from lanes.catalog.controllers import normalise
from lanes.clock import ManualClock
from lanes.control.loop import ControlLoop
from lanes.lane.sync import scan_lane_keys
from lanes.pools import decide_width
from lanes.priority import Priority
from lanes.routing.observers import Attempt
from lanes.routing.runtime import Runtime, provision_lanes
from tests.polling import eventually


def document(controller, width=10, ceiling=100) -> dict:
    return {
        "pools": [
            {"name": "gpu", "width": width, "ceiling": ceiling, "controller": controller},
            {"name": "other", "width": 3, "ceiling": 9, "controller": controller},
        ],
        "models": [{"name": "m", "base_url": "http://127.0.0.1:9/v1", "pool": "gpu"},
                   {"name": "n", "base_url": "http://127.0.0.1:9/v1", "pool": "other"}],
        "workflows": [{"name": "chat", "candidates": ["m"]}],
    }


OVERLOAD = {"kind": "overload", "interval_seconds": 1.0}


@pytest.fixture
def setup(make_settings, one_redis_url):
    settings = make_settings(redis_url=one_redis_url)
    engine = open_catalog(settings)
    apply_document(engine, document(OVERLOAD))
    clock = ManualClock()
    rt = Runtime(settings, redis_url=one_redis_url, clock=clock, engine=engine, refresh_seconds=0.0)
    provision_lanes(rt.client, settings, rt.table())
    yield rt, engine, clock
    rt.close()


class Recorder:
    def __init__(self) -> None:
        self.events = []

    def record(self, kind, **fields) -> None:
        self.events.append((kind, fields))


def tick(rt, loop, clock, lease, name="gpu"):
    clock.advance(1.0)
    table = rt.table()
    pool = table.pools[name]
    return loop.tick(pool, table, rt.lane(pool), lease, clock.monotonic())


def leader(rt, memory_gated=True):
    events = Recorder()
    loop = ControlLoop(rt.control, events, memory_gated=memory_gated)
    pool = rt.table().pools["gpu"]
    lease = rt.control.lease(pool.id, "me", 30)
    return loop, lease, events, pool


def overload(rt, pool, generation, status=529, priority=Priority.INTERACTIVE):
    for observer in rt.observers:
        observer.on_attempt(Attempt(workflow="chat", model="m", pool=pool.name, pool_id=pool.id, priority=priority,
                                    outcome="failed", status=status, generation=generation))


def test_a_growth_waiting_for_its_judgment_is_read_at_the_next_decision_not_at_the_scrape_cadence(setup):
    rt, engine, clock = setup
    apply_document(engine, document({"kind": "vllm", "interval_seconds": 1.0, "scrape_seconds": 60.0,
                                     "timeout_seconds": 0.2}))
    loop, lease, _, pool = leader(rt)
    tick(rt, loop, clock, lease)  # starts from the configured width
    tick(rt, loop, clock, lease)  # the first scrape (nothing listens at the model's address)
    scraper = loop._scrapers[pool.id]
    first = scraper.last_at
    tick(rt, loop, clock, lease)
    assert scraper.last_at == first  # the cadence: one scrape a minute
    # A growth is out that no reading has judged yet (laws.wants_reading), as its decision left it.
    state_key = rt.control.ns.control_state(pool.id)
    laws = json.loads(rt.client.hget(state_key, "laws") or "{}")
    laws.setdefault("vllm", {})["unjudged_growth"] = True
    rt.client.hset(state_key, "laws", json.dumps(laws))
    tick(rt, loop, clock, lease)
    assert scraper.last_at == clock.monotonic() != first  # read now, 2 s after the last scrape
    assert rt.control.read(pool.id).laws["vllm"].get("unjudged_growth")  # a failed reading judges nothing


def test_a_burst_of_stale_overload_answers_costs_exactly_one_cut(setup):
    rt, _, clock = setup
    loop, lease, events, pool = leader(rt)
    tick(rt, loop, clock, lease)  # the controller starts at the configured width, generation 1
    generation = rt.control_generation(pool)
    for _ in range(1000):  # one overload event: every request admitted under one generation is refused
        overload(rt, pool, generation)
    first = tick(rt, loop, clock, lease)
    assert first.decision == "cut" and first.width == 8
    for _ in range(1000):  # the tail of the same event arrives after the cut
        overload(rt, pool, generation)
    second = tick(rt, loop, clock, lease)
    assert second.decision != "cut"
    state = rt.control.read(pool.id)
    assert state.width == 8 and state.stale_overloads == 1000 and state.rejections == {"529": 2000}
    assert [e for e in events.events if e[0] == "width_change"] == [
        ("width_change", {"pool": "gpu", "controller": "overload", "old": 10, "new": 8,
                          "reason": first.reason, "generation": generation + 1, "leader": lease})]
    assert rt.lane(pool).stats().width == 8


def test_background_overloads_never_cut_the_width(setup):
    rt, _, clock = setup
    loop, lease, _, pool = leader(rt)
    tick(rt, loop, clock, lease)
    generation = rt.control_generation(pool)
    for _ in range(50):
        overload(rt, pool, generation, priority=Priority.BACKGROUND)
    assert tick(rt, loop, clock, lease).decision != "cut"
    assert rt.control.read(pool.id).background_overloads == 50


def test_an_answer_with_a_status_not_listed_is_not_an_overload(setup):
    rt, _, clock = setup
    loop, lease, _, pool = leader(rt)
    tick(rt, loop, clock, lease)
    overload(rt, pool, rt.control_generation(pool), status=503)
    assert tick(rt, loop, clock, lease).decision != "cut"


def test_pools_are_controlled_independently(setup):
    rt, _, clock = setup
    loop, lease, _, pool = leader(rt)
    other = rt.table().pools["other"]
    other_lease = rt.control.lease(other.id, "me", 30)
    tick(rt, loop, clock, lease)
    tick(rt, loop, clock, other_lease, "other")
    overload(rt, pool, rt.control_generation(pool))
    tick(rt, loop, clock, lease)
    tick(rt, loop, clock, other_lease, "other")
    assert rt.control.read(pool.id).width == 8
    assert rt.control.read(other.id).width == 3


def test_only_the_lease_holder_writes_and_a_successor_gets_a_higher_fence(setup):
    rt, _, clock = setup
    pool = rt.table().pools["gpu"]
    first = rt.control.lease(pool.id, "first", 0.3)
    assert rt.control.lease(pool.id, "second", 0.3) is None
    assert rt.control.commit(pool.id, first, {"decision": "hold"}, new_generation=False) is not None
    second = eventually(lambda: rt.control.lease(pool.id, "second", 30), timeout=10, what="the lease lapsing")
    assert int(second.rsplit("|", 1)[1]) > int(first.rsplit("|", 1)[1])
    # The deposed leader's write is refused: no two leaders act on one pool.
    assert rt.control.commit(pool.id, first, {"width": 99}, new_generation=True) is None
    assert rt.control.read(pool.id).width != 99


def test_without_a_memory_gate_the_ceiling_is_clamped_to_the_configured_width_and_cuts_still_apply(setup, caplog):
    rt, _, clock = setup
    loop, lease, _, pool = leader(rt, memory_gated=False)
    tick(rt, loop, clock, lease)
    state = rt.control.read(pool.id)
    assert "ceiling 100 clamped to the configured width 10" in state.fail_closed
    assert "LANES_MEMORY_GATE_HIGH" in state.fail_closed
    # The backend said it is full: the cut applies (it used to be ignored while failing closed).
    overload(rt, pool, rt.control_generation(pool))
    composed = tick(rt, loop, clock, lease)
    assert composed.decision == "cut" and rt.lane(pool).stats().width == 8
    assert any(r.levelname == "CRITICAL" and "memory gate" in r.getMessage() for r in caplog.records)
    # A gate on the workers lifts the clamp (and the flag).
    gated = ControlLoop(rt.control, Recorder(), memory_gated=True)
    tick(rt, gated, clock, lease)
    assert rt.control.read(pool.id).fail_closed is None


@pytest.mark.parametrize("high, low, gated", [(None, None, False), (0.9, None, True), (0.9, 0.7, True),
                                               (0.8, 0.9, False)])
def test_a_worker_without_a_sensible_memory_gate_runs_its_controllers_failing_closed(
        make_settings, one_redis_url, high, low, gated):
    # What a worker's runtime starts with: the gate settings decide, as the worker's own gate does.
    settings = make_settings(redis_url=one_redis_url, memory_gate_high=high, memory_gate_low=low)
    engine = open_catalog(settings)
    apply_document(engine, document(OVERLOAD))
    rt = Runtime(settings, redis_url=one_redis_url, engine=engine)
    try:
        loop = rt.start_steward().loop
        assert loop.memory_gated is gated
        assert loop.fails_closed(rt.table().pools["gpu"]) is not gated  # ceiling 100 above width 10
    finally:
        rt.close()


def test_off_means_off_and_an_operators_width_restarts_the_controllers(setup):
    rt, engine, clock = setup
    loop, lease, _, pool = leader(rt)
    tick(rt, loop, clock, lease)
    overload(rt, pool, rt.control_generation(pool))
    tick(rt, loop, clock, lease)
    assert rt.authority.width(rt.table().pools["gpu"]) == 8  # learned
    # Turning the controller off: exactly the configured width, at the next follow.
    apply_document(engine, document({"kind": "off"}))
    off = rt.table().pools["gpu"]
    assert rt.authority.width(off) == 10
    rt.authority.sync(off, rt.lane(off))  # what every worker's follower does each pass
    assert rt.lane(off).stats().width == 10
    # On again with a new configured width: the controllers start from it, not from what they learned.
    apply_document(engine, document(OVERLOAD, width=12))
    again = rt.table().pools["gpu"]
    assert rt.authority.width(again) == 12
    tick(rt, loop, clock, lease)
    assert rt.control.read(again.id).width == 12 and rt.lane(again).stats().width == 12


def test_a_lane_recreated_after_redis_lost_its_state_comes_back_at_the_learned_width(setup):
    rt, _, clock = setup
    loop, lease, _, pool = leader(rt)
    tick(rt, loop, clock, lease)
    overload(rt, pool, rt.control_generation(pool))
    tick(rt, loop, clock, lease)
    assert rt.lane(pool).stats().width == 8
    keys = scan_lane_keys(rt.client, rt.settings.key_prefix)
    assert keys
    rt.client.delete(*keys)
    lane = rt.lane(pool)
    lane.try_acquire(Priority.INTERACTIVE)  # the lane's state is re-created from its owner's width
    assert lane.stats().exists and lane.stats().width == 8  # the learned width, not the catalog's 10


def test_with_every_controller_off_the_width_is_exactly_the_configured_width():
    from lanes.catalog.routing import PoolInfo

    off = PoolInfo(id=1, name="p", width=6, floor=1, ceiling=12, controller={"kind": "off"}, metrics_url=None,
                   enabled=True, previous_names=(), controllers={})
    assert decide_width(off, None) == 6
    on = PoolInfo(id=1, name="p", width=6, floor=2, ceiling=12, controller={"kind": "overload"}, metrics_url=None,
                  enabled=True, previous_names=(), controllers={"overload": normalise({}, "overload")})
    assert decide_width(on, None) == 6  # starts at the configured width


@pytest.mark.slow
def test_lanes_pools_shows_configured_and_current_width_and_each_controllers_last_decision(setup):
    import json
    import os
    import subprocess
    import sys

    rt, engine, clock = setup
    loop, lease, _, pool = leader(rt)
    tick(rt, loop, clock, lease)
    overload(rt, pool, rt.control_generation(pool))
    tick(rt, loop, clock, lease)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANES_")}
    env.update(LANES_REDIS_URL=rt.redis_url, LANES_DATABASE_URL=rt.settings.catalog_url(),
               LANES_STATE_DIR=str(rt.settings.state_dir))
    # A holder of workflow "chat": the row shows its share books (issue 14).
    permit = rt.lane(pool).acquire(Priority.INTERACTIVE, 1.0, workflow="chat")
    shown = subprocess.run([sys.executable, "-m", "lanes.cli", "pools", "--json"], env=env, capture_output=True,
                           text=True, timeout=60)
    permit.release()
    assert shown.returncode == 0, shown.stderr
    row = next(r for r in json.loads(shown.stdout) if r["pool"] == "gpu")
    assert row["workflows"] == [{"priority": "interactive", "workflow": "chat", "in_flight": 1, "waiting": 0,
                                 "owed": 0}]
    assert row["configured_width"] == 10 and row["width"] == 8 and row["authority_width"] == 8
    assert list(row["controllers"]) == ["overload"]
    assert row["control"]["decision"] == "cut" and row["control"]["controller"] == "overload"
    assert row["control"]["proposals"]["overload"]["decision"] == "cut"
    table = subprocess.run([sys.executable, "-m", "lanes.cli", "pools"], env={**env, "COLUMNS": "200"},
                           capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and "8 (configured 10)" in table.stdout and "overload" in table.stdout


def test_a_fleet_is_sized_from_the_ceiling_while_a_controller_runs_and_from_the_width_when_off(make_settings):
    from workers.fleet import plan_fleet

    settings = make_settings(fleet_pool="gevent", fleet_held_messages=50)
    engine = open_catalog(settings)
    apply_document(engine, document(OVERLOAD, width=10, ceiling=100))
    # The lane the fleet must be able to fill: the ceiling while a controller may move the width.
    plan = plan_fleet(rt_table(engine), "gpu", settings)
    assert (plan.width, plan.foreground_held) == (100, 50)
    apply_document(engine, document({"kind": "off"}, width=10, ceiling=100))
    plan = plan_fleet(rt_table(engine), "gpu", settings)
    assert (plan.width, plan.foreground_held) == (10, 50)
    # The threads pool: two threads a slot of the width to fill, capped at 64.
    threads = make_settings(fleet_pool="threads")
    apply_document(engine, document(OVERLOAD, width=10, ceiling=100))
    assert plan_fleet(rt_table(engine), "gpu", threads).foreground_held == 64
    apply_document(engine, document({"kind": "off"}, width=10, ceiling=100))
    assert plan_fleet(rt_table(engine), "gpu", threads).foreground_held == 20


def rt_table(engine):
    from lanes.catalog import load_routing

    return load_routing(engine)


def test_a_follower_with_an_older_view_of_the_catalog_never_puts_back_the_width_just_set(
        make_settings, one_redis_url):
    # ``pools set-width`` writes the catalog and resizes the live lane at once; a
    # worker's follower still holding the catalog from before (its view is
    # re-read at most once a refresh) must not resize the lane back.
    from lanes.catalog.pools import set_pool_width
    from lanes.control.steward import Steward

    settings = make_settings(redis_url=one_redis_url)
    engine = open_catalog(settings)
    apply_document(engine, document({"kind": "off"}))
    rt = Runtime(settings, redis_url=one_redis_url, engine=engine, refresh_seconds=3600.0)
    try:
        provision_lanes(rt.client, settings, rt.table())
        stale = rt.table().pools["gpu"]
        assert rt.lane(stale).stats().width == 10
        # The operator's set-width, as lanes.ops.pools.set_width does it.
        fresh = set_pool_width(engine, "gpu", 3)
        rt.lane(fresh).resize(3)
        assert rt.table().pools["gpu"].width == 10  # the follower's view is still the old one
        Steward(rt).pass_once()
        assert rt.lane(stale).stats().width == 3
        assert rt.table().pools["gpu"].width == 3  # and it has caught up with the catalog
    finally:
        rt.close()

"""Fleet sizing: two sets of threads per fleet, each able to fill the lane."""

import pytest

from lanes import InvalidInput
from lanes.catalog import apply_document, load_routing, open_catalog
from workers.background import BackgroundQueue
from workers.fleet import fleet_names, plan_fleet
from workers.main import main as worker_main

DOC = {
    "pools": [
        {"name": "big", "width": 40, "ceiling": 64},
        {"name": "huge", "width": 60, "ceiling": 64},
        {"name": "small", "width": 1},
    ],
    "models": [
        {"name": "m-big", "base_url": "http://127.0.0.1:9/v1", "pool": "big"},
        {"name": "m-huge", "base_url": "http://127.0.0.1:9/v1", "pool": "huge"},
        {"name": "m-small", "base_url": "http://127.0.0.1:9/v1", "pool": "small"},
        {"name": "hosted", "base_url": "https://api.example.com/v1"},
    ],
    "workflows": [
        {"name": "a", "candidates": ["m-big", "hosted"]},
        {"name": "b", "candidates": ["m-small"]},
        {"name": "c", "candidates": ["hosted"]},
        {"name": "d", "candidates": ["m-huge"]},
    ],
}


@pytest.fixture
def table(make_settings):
    engine = open_catalog(make_settings())
    apply_document(engine, DOC)
    return load_routing(engine)


def threads(plan) -> tuple[int, int, int]:
    return plan.foreground_threads, plan.background_threads, plan.concurrency


def test_each_queue_gets_width_times_workers_per_lane_within_floor_and_cap(table, make_settings):
    settings = make_settings(workers_per_lane=2, fleet_min_workers=3, fleet_max_workers=50)
    assert fleet_names(table) == ["big", "hosted", "huge", "small"]
    assert threads(plan_fleet(table, "big", settings)) == (50, 50, 100)  # capped
    small = plan_fleet(table, "small", settings)
    assert threads(small) == (3, 3, 6)  # floor
    assert small.queues == ("lanes.small", "lanes.small.background")
    assert threads(plan_fleet(table, "hosted", settings)) == (6, 6, 12)  # no lane: a pool of the floor's width


def test_a_queue_never_gets_fewer_threads_than_the_width(table, make_settings):
    # The cap bounds the spare waiters, never the slots: below the width,
    # foreground work could not reach every slot, nor background fill them.
    plan = plan_fleet(table, "huge", make_settings(workers_per_lane=2, fleet_max_workers=50))
    assert threads(plan) == (60, 60, 120)


def test_a_controllers_ceiling_above_the_cap_is_filled_within_the_cap(make_settings):
    # A controller may learn any width up to the ceiling; one worker's
    # threads for that headroom stop at fleet_max_workers (64), while the
    # configured width is always covered.
    document = {
        "pools": [{"name": "wide", "width": 10, "ceiling": 512,
                   "controller": {"kind": "overload", "interval_seconds": 1.0}},
                  {"name": "wider", "width": 100, "ceiling": 512,
                   "controller": {"kind": "overload", "interval_seconds": 1.0}}],
        "models": [{"name": "m", "base_url": "http://127.0.0.1:9/v1", "pool": "wide"},
                   {"name": "n", "base_url": "http://127.0.0.1:9/v1", "pool": "wider"}],
        "workflows": [{"name": "a", "candidates": ["m"]}, {"name": "b", "candidates": ["n"]}],
    }
    settings = make_settings(workers_per_lane=2)
    engine = open_catalog(settings)
    apply_document(engine, document)
    table = load_routing(engine)
    wide = plan_fleet(table, "wide", settings)
    assert wide.width == 512
    assert threads(wide) == (64, 64, 128)
    assert threads(plan_fleet(table, "wider", settings)) == (100, 100, 200)


def test_the_fleet_runs_a_process_per_queue_each_with_its_set_of_threads(table, make_settings):
    plan = plan_fleet(table, "small", make_settings())
    assert plan.worker_args() == {
        "foreground": ["--fleet", "small", "--foreground-threads", "2"],
        "background": ["--fleet", "small", "--background-threads", "2"],
    }
    assert plan.describe() == ("fleet small: width 1; a process of 2 threads for lanes.small, "
                               "one of 2 for lanes.small.background")


def test_the_worker_refuses_to_take_no_queue(capsys):
    with pytest.raises(SystemExit) as exited:
        worker_main(["--fleet", "x"])
    assert exited.value.code == 2
    assert "give --foreground-threads, --background-threads or both" in capsys.readouterr().err


@pytest.mark.parametrize("args", [
    ["--fleet", "x", "--foreground-threads", "0", "--background-threads", "2"],
    ["--fleet", "x", "--foreground-threads", "2", "--background-threads", "-1"],
    ["--fleet", "x", "--background-threads", "0"],
])
def test_the_worker_refuses_a_set_of_no_threads(args, capsys):
    with pytest.raises(SystemExit) as exited:
        worker_main(args)
    assert exited.value.code == 2
    assert "must be >= 1" in capsys.readouterr().err


def test_a_background_queue_needs_a_thread():
    with pytest.raises(ValueError, match="background threads 0 must be >= 1"):
        BackgroundQueue("lanes.p.background", 0)


def test_an_unknown_fleet_is_refused_with_the_known_ones(table, make_settings):
    with pytest.raises(InvalidInput, match=r"unknown fleet 'nope' \(known: big, hosted, huge, small\)"):
        plan_fleet(table, "nope", make_settings())

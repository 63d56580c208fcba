"""Fleet sizing: two processes per fleet, each holding up to a bound of messages as lane waiters."""

import pytest

from lanes import InvalidInput
from lanes.catalog import apply_document, load_routing, open_catalog
from workers.background import BackgroundQueue
from workers.fleet import fleet_names, plan_fleet
from workers.main import DEFAULT_POOL, parse as worker_args
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


def held(plan) -> tuple[int, int, int]:
    return plan.foreground_held, plan.background_held, plan.held


def test_each_queue_holds_the_configured_bound_of_messages(table, make_settings):
    settings = make_settings(fleet_pool="gevent", fleet_held_messages=50)
    assert fleet_names(table) == ["big", "hosted", "huge", "small"]
    assert held(plan_fleet(table, "big", settings)) == (50, 50, 100)
    small = plan_fleet(table, "small", settings)
    assert held(small) == (50, 50, 100)
    assert small.queues == ("lanes.small", "lanes.small.background")
    assert held(plan_fleet(table, "hosted", settings)) == (50, 50, 100)


def test_the_default_pool_is_the_settings_and_the_workers_alike(make_settings):
    assert make_settings().fleet_pool == DEFAULT_POOL == "threads"  # the worker's own, read before patching


def test_the_gevent_pool_holds_thousands_of_messages(table, make_settings):
    assert held(plan_fleet(table, "small", make_settings(fleet_pool="gevent"))) == (2000, 2000, 4000)


def test_the_threads_pool_holds_two_threads_a_slot_within_its_floor_and_cap(table, make_settings):
    settings = make_settings(fleet_pool="threads")
    assert held(plan_fleet(table, "small", settings)) == (2, 2, 4)  # floor
    assert held(plan_fleet(table, "big", settings)) == (64, 64, 128)  # 2 x 64 to fill, capped
    assert held(plan_fleet(table, "hosted", settings)) == (2, 2, 4)  # no lane: width 1


def test_a_queue_never_holds_fewer_messages_than_the_width(table, make_settings):
    # Below the width, foreground work could not reach every slot, nor background fill them.
    for pool in ("gevent", "threads"):
        plan = plan_fleet(table, "huge", make_settings(fleet_pool=pool, fleet_held_messages=50))
        assert held(plan) == (60, 60, 120)


@pytest.mark.parametrize("value", [0, -1, 100_001])
def test_a_bound_out_of_range_is_refused_with_the_value_and_the_range(value, make_settings):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as refused:
        make_settings(fleet_held_messages=value)
    text = str(refused.value)
    assert "fleet_held_messages" in text and str(value) in text


def test_the_fleet_runs_a_process_per_queue_each_with_its_bound(table, make_settings):
    plan = plan_fleet(table, "small", make_settings(fleet_pool="gevent", fleet_held_messages=3))
    assert plan.worker_args() == {
        "foreground": ["--fleet", "small", "--foreground", "3", "--pool", "gevent"],
        "background": ["--fleet", "small", "--background", "3", "--pool", "gevent"],
    }
    assert plan.describe() == ("fleet small: width 1; a process holding up to 3 messages of lanes.small, "
                               "one up to 3 of lanes.small.background")


def test_the_worker_refuses_to_take_no_queue(capsys):
    with pytest.raises(SystemExit) as exited:
        worker_main(["--fleet", "x"])
    assert exited.value.code == 2
    assert "give --foreground N, --background N or both" in capsys.readouterr().err


@pytest.mark.parametrize("args, shown", [
    (["--fleet", "x", "--foreground", "0", "--background", "2"], "--foreground 0"),
    (["--fleet", "x", "--foreground", "2", "--background", "-1"], "--background -1"),
    (["--fleet", "x", "--background", "100001"], "--background 100001"),
])
def test_the_worker_refuses_a_bound_out_of_range_in_one_line(args, shown, capsys):
    with pytest.raises(SystemExit) as exited:
        worker_main(args)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"{shown} is out of range: give 1 to 100000 messages" in err


def test_the_worker_runs_the_pool_the_setting_names_unless_told(monkeypatch):
    monkeypatch.delenv("LANES_FLEET_POOL", raising=False)
    assert worker_args(["--fleet", "x", "--foreground", "2"]).pool == DEFAULT_POOL
    monkeypatch.setenv("LANES_FLEET_POOL", "threads")
    assert worker_args(["--fleet", "x", "--foreground", "2"]).pool == "threads"
    assert worker_args(["--fleet", "x", "--foreground", "2", "--pool", "gevent"]).pool == "gevent"


def test_the_worker_refuses_an_unknown_pool_setting_in_one_line(monkeypatch):
    monkeypatch.setenv("LANES_FLEET_POOL", "eventlet")
    with pytest.raises(SystemExit) as exited:
        worker_args(["--fleet", "x", "--foreground", "2"])
    assert str(exited.value) == "error: LANES_FLEET_POOL='eventlet' is not a pool: give one of gevent, threads"


def test_a_background_queue_needs_a_thread():
    with pytest.raises(ValueError, match="background threads 0 must be >= 1"):
        BackgroundQueue("lanes.p.background", 0)


def test_an_unknown_fleet_is_refused_with_the_known_ones(table, make_settings):
    with pytest.raises(InvalidInput, match=r"unknown fleet 'nope' \(known: big, hosted, huge, small\)"):
        plan_fleet(table, "nope", make_settings())


def test_a_worker_that_cannot_open_the_files_its_bound_needs_says_so_in_one_line():
    import subprocess
    import sys

    # A child whose hard limit is 512 files: 2,000 held messages cannot fit.
    code = ("import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512)); "
            "from workers.main import main; main(['--fleet', 'x', '--foreground', '2000'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: holding 2000 messages needs 4256 open files and this process may open 512")
    assert "lower LANES_FLEET_HELD_MESSAGES" in lines[0] and "to 128" in lines[0]


def test_a_worker_raises_its_open_file_limit_to_what_its_bound_needs():
    import resource

    from workers.main import ensure_file_limit, files_needed

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < files_needed(500):
        pytest.fail(f"this machine's hard open-file limit {hard} is below what the test needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        assert ensure_file_limit(500) is None
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= files_needed(500)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

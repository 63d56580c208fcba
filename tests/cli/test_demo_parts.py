"""The demo's parts that need no running fleet: its catalog changes, its width ranges, its refusals."""

from __future__ import annotations

import os
import subprocess
import sys

from lanes.demo.control import ADAPTIVE_POOL, VLLM, decisions_between, move_port, width_range, with_controller


def test_the_controller_goes_on_the_adaptive_pool_only():
    document = {"pools": [{"name": ADAPTIVE_POOL, "controller": {"kind": "off"}}, {"name": "other"}]}
    assert with_controller(document)
    assert document["pools"][0]["controller"] == VLLM and "controller" not in document["pools"][1]
    assert not with_controller({"pools": [{"name": "other"}]})


def test_a_taken_port_moves_every_model_served_on_it_and_no_other():
    document = {"models": [{"name": "a", "base_url": "http://127.0.0.1:8700/v1"},
                           {"name": "b", "base_url": "http://localhost:8700/v1"},
                           {"name": "c", "base_url": "http://127.0.0.1:8701/v1"},
                           {"name": "d", "base_url": "https://api.example.com/v1"}]}
    new = move_port(document, 8700)
    assert new != 8700
    assert [m["base_url"] for m in document["models"]] == [
        f"http://127.0.0.1:{new}/v1", f"http://localhost:{new}/v1", "http://127.0.0.1:8701/v1",
        "https://api.example.com/v1"]


def test_a_width_range_covers_only_its_window():
    times, widths = [0.0, 1.0, 2.0, 3.0, 4.0], [4, 6, 7, 6, 3]
    assert width_range(times, widths, 1.0, 3.0) == "6..7"
    assert width_range(times, widths, 4.0, 9.0) == "3"
    assert width_range(times, widths, 5.0, 9.0) is None


def test_a_shortfall_names_the_controllers_most_frequent_decisions_in_its_window():
    hold = ("hold", "3 running of 4 (4 in flight): not near full")
    decisions = [(0.5, "grow", "every slot used"), (1.0, *hold), (2.0, *hold), (3.0, "hold", "no new scrape"),
                 (9.0, "cut", "saturated")]
    assert decisions_between(decisions, 1.0, 3.0) == (
        "hold (3 running of 4 (4 in flight): not near full) x2; hold (no new scrape) x1")
    assert decisions_between(decisions, 4.0, 8.0).startswith("no decision at all")


def test_a_plot_path_the_demo_cannot_write_is_refused_before_anything_starts(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANES_")}
    env["LANES_STATE_DIR"] = str(tmp_path / "state")
    done = subprocess.run([sys.executable, "-m", "lanes.cli", "demo", "--plot", str(blocker / "plot.png")],
                          env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: --plot ") and "a-file" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "state" / "redis").exists()  # nothing was started


def test_a_second_run_of_the_demo_finds_no_quiet_lane_and_no_width_learned_before(make_settings):
    # The embedded Redis keeps an append-only file: a run that starts it again found the last
    # run's lanes, each in a quiet period of one lease (a new server run), and the dialog pool's
    # width learned in that run (every request waited about 20 s; the controller started at a
    # cap of 3 for a backend of 6). The demo starts them over.
    import redis

    from lanes.catalog import apply_document, load_routing, open_catalog, read_document
    from lanes.catalog.controllers import kinds_text
    from lanes.control.store import ControlStore
    from lanes.demo.run import EXAMPLE_CATALOG, _provision, _start_over
    from lanes.embedded import EmbeddedRedis
    from lanes.namespace import Namespace
    from lanes.pools import decide_width, pool_lane

    settings = make_settings()
    server = EmbeddedRedis(settings.state_dir / "redis")
    url = server.ensure()
    engine = open_catalog(settings)
    try:
        document = read_document(EXAMPLE_CATALOG)
        with_controller(document)  # as the demo applies it
        apply_document(engine, document)
        table = load_routing(engine)
    finally:
        engine.dispose()
    pool = table.pools[ADAPTIVE_POOL]
    try:
        _provision(settings, url, table, True)
        client = redis.Redis.from_url(url)
        lane = pool_lane(client, settings, pool)
        assert lane.try_acquire("interactive") is not None  # a slot the last run's workers held
        client.hset(Namespace(settings.key_prefix).control_state(pool.id), mapping={
            "width": 3, "configured": pool.width, "kinds": kinds_text(pool), "generation": 1})
        lane.close()
        client.close()
        server.stop()
        url = server.ensure()  # the next run starts it again: the file is read back
        client = redis.Redis.from_url(url)
        lane = pool_lane(client, settings, pool)
        store = ControlStore(client, Namespace(settings.key_prefix))
        before = lane.stats()
        assert before.quiet_seconds > 0  # what the second run met: a new server run, a quiet lane
        assert decide_width(pool, store.read(pool.id)) == 3
        _start_over(settings, url, table)
        _provision(settings, url, table, True)
        after = lane.stats()
        assert after.quiet_seconds == 0 and after.in_flight == 0 and after.width == pool.width
        assert decide_width(pool, store.read(pool.id)) == pool.width
        lane.close()
        client.close()
    finally:
        server.stop()

"""The lane-config check: each mismatch kind appears once and clears once."""

from __future__ import annotations

import subprocess
import sys

import pytest
import redis
import sqlalchemy as sa

from lanes.catalog import apply_document, load_routing, make_engine, recent_events
from lanes.catalog.migrate import ensure_schema
from lanes.ops.lanecheck import EVENT_KIND, MismatchLog, check_lanes, readiness_detail
from lanes.routing.runtime import pool_lane
from lanes.settings import Settings
from lanes.sim import SimModel, Simulator


def document(**changes) -> dict:
    models = {
        "m0": {"name": "m0", "base_url": "http://farm:8000/v1", "pool": "gpu0", "service": "s0"},
        "m1": {"name": "m1", "base_url": "http://farm:8001/v1", "pool": "gpu1", "service": "s1"},
    }
    for name, change in changes.get("models", {}).items():
        models[name] = {**models.get(name, {"name": name, "base_url": "http://farm:8002/v1"}), **change}
    widths = {"gpu0": 4, "gpu1": 2, **changes.get("widths", {})}
    return {
        "pools": [{"name": name, "width": width, "ceiling": 16} for name, width in widths.items()],
        "models": list(models.values()),
        "workflows": [{"name": "w", "candidates": changes.get("candidates", ["m0", "m1"])}],
        "services": [{"name": "s0", "limit": 4}, {"name": "s1", "limit": 2}],
    }


def setup(db_url, redis_url, tmp_path):
    engine = make_engine(db_url)
    ensure_schema(engine)
    settings = Settings(state_dir=tmp_path / "state", redis_url=redis_url, database_url=db_url)
    client = redis.Redis.from_url(redis_url)
    return engine, settings, client


def run_check(engine, settings, client):
    report = check_lanes(settings, load_routing(engine), client)
    MismatchLog(client, engine, prefix=settings.key_prefix).observe(report)
    return report


def transitions(engine) -> list[tuple[str, str]]:
    return [(e.detail["state"], e.detail["key"]) for e in reversed(recent_events(engine, kind=EVENT_KIND))]


def unpool_m1(engine) -> None:
    # `lanes catalog apply` refuses a farm model without a pool; a catalog
    # edited by hand can still hold one.
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE models SET pool_id = NULL WHERE name = 'm1'"))
        conn.execute(sa.text("UPDATE catalog_version SET version = version + 1"))


def m1_on_unknown_service(engine) -> None:
    # `lanes catalog apply` refuses a model whose service the file does not
    # declare; a catalog edited by hand can still name one.
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE models SET service = 's9' WHERE name = 'm1'"))
        conn.execute(sa.text("UPDATE catalog_version SET version = version + 1"))


CASES = [
    # (kind key, the catalog change that makes it, the change that clears it)
    ("model_without_pool:m1", unpool_m1, {}),
    ("service_split:s0", {"models": {"m1": {"service": "s0"}}}, {}),
    ("pool_over_services:gpu0", {"widths": {"gpu0": 6}}, {"widths": {"gpu0": 4}}),
    ("unknown_service:s9", m1_on_unknown_service, {}),
]


def test_each_mismatch_kind_is_one_event_when_it_appears_and_one_when_it_clears(db_url, one_redis_url, tmp_path):
    engine, settings, client = setup(db_url, one_redis_url, tmp_path)
    apply_document(engine, document())
    assert run_check(engine, settings, client).ok
    expected = []
    for key, broken, fixed in CASES:
        if callable(broken):
            broken(engine)
        else:
            apply_document(engine, document(**broken))
        first = run_check(engine, settings, client)
        assert key in {m.key for m in first.mismatches}, first.mismatches
        run_check(engine, settings, client)  # the same finding again: no new event
        apply_document(engine, document(**fixed))
        assert key not in {m.key for m in run_check(engine, settings, client).mismatches}
        run_check(engine, settings, client)
        expected += [("appeared", key), ("cleared", key)]
    # A split service also overloads no pool on its own; only the listed keys matter here.
    assert [t for t in transitions(engine) if t[1] in {c[0] for c in CASES}] == expected
    engine.dispose()


def test_a_controller_past_the_services_sum_is_reported_from_the_live_width(db_url, one_redis_url, tmp_path):
    engine, settings, client = setup(db_url, one_redis_url, tmp_path)
    apply_document(engine, document())
    lane = pool_lane(client, settings, load_routing(engine).pools["gpu0"])
    lane.provision()
    assert run_check(engine, settings, client).ok
    lane.resize(7)  # what a controller does to the live lane; the catalog still says 4
    report = run_check(engine, settings, client)
    assert [(m.kind, m.subject, m.detail["live_width"]) for m in report.mismatches] == [
        ("controller_over_services", "gpu0", 7)
    ]
    detail = readiness_detail(client, prefix=settings.key_prefix)
    assert detail["ok"] is False and detail["fails_readiness"] is False and "gpu0" in detail["mismatches"][0]
    lane.resize(4)
    assert run_check(engine, settings, client).ok
    assert transitions(engine) == [
        ("appeared", "controller_over_services:gpu0"), ("cleared", "controller_over_services:gpu0")
    ]
    assert readiness_detail(client, prefix=settings.key_prefix)["ok"] is True
    engine.dispose()


@pytest.mark.slow  # a few seconds of waiting; the fast tier keeps to its 8 minutes
def test_the_readiness_detail_never_fails_even_when_redis_is_gone():
    gone = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    detail = readiness_detail(gone, prefix="lanes:v2")
    assert detail["ok"] is None and detail["fails_readiness"] is False


def test_farm_limits_come_from_the_simulators_endpoint(sqlite_url, one_redis_url, tmp_path):
    engine = make_engine(sqlite_url)
    ensure_schema(engine)
    with Simulator([SimModel(name="m0", capacity=3), SimModel(name="m1", capacity=2)], port=0) as sim:
        doc = document(models={"m0": {"service": "m0"}, "m1": {"service": "m1"}})
        # The catalog declares the services; their limits come from the farm.
        doc["services"] = [{"name": "m0", "limit": 64}, {"name": "m1", "limit": 64}]
        apply_document(engine, doc)
        settings = Settings(state_dir=tmp_path / "s", database_url=sqlite_url,
                            farm_limits_url=sim.base_url.removesuffix("/v1") + "/farm/services")
        report = check_lanes(settings, load_routing(engine), None)
    assert report.limits_source.endswith("/farm/services")
    assert [(m.kind, m.subject, m.detail["allowed"]) for m in report.mismatches] == [
        ("pool_over_services", "gpu0", 3)
    ]
    engine.dispose()


def test_lanes_check_prints_the_report_and_exits_1_on_a_mismatch_0_when_clean(sqlite_url, tmp_path):
    engine = make_engine(sqlite_url)
    ensure_schema(engine)
    apply_document(engine, document())
    env = {"LANES_DATABASE_URL": sqlite_url, "LANES_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"}

    def check():
        return subprocess.run([sys.executable, "-m", "lanes.cli", "check", "--no-redis"], env=env,
                              capture_output=True, text=True, timeout=60)

    clean = check()
    assert clean.returncode == 0 and "ok" in clean.stdout
    apply_document(engine, document(widths={"gpu0": 9}))
    broken = check()
    assert broken.returncode == 1
    assert "pool_over_services: pool 'gpu0' has width 9" in broken.stdout
    assert "Traceback" not in broken.stderr
    env["LANES_FARM_LIMITS_URL"] = "http://127.0.0.1:1/farm/services"
    unreachable = check()
    assert unreachable.returncode == 3 and len(unreachable.stderr.splitlines()) == 1
    assert "farm limits at http://127.0.0.1:1/farm/services did not answer" in unreachable.stderr
    engine.dispose()


@pytest.mark.slow
def test_lanes_check_exits_2_for_an_unreadable_farm_answer_not_1_the_code_of_a_mismatch(sqlite_url, tmp_path):
    engine = make_engine(sqlite_url)
    ensure_schema(engine)
    apply_document(engine, document())
    engine.dispose()
    with Simulator([SimModel(name="m0", capacity=3)], port=0) as sim:
        env = {"LANES_DATABASE_URL": sqlite_url, "LANES_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"}
        root = sim.base_url.removesuffix("/v1")
        codes = {}
        # Not JSON (the simulator's metrics text), and JSON that is not a map of limits.
        for name, url in (("text", f"{root}/metrics"), ("json", f"{root}/v1/models")):
            env["LANES_FARM_LIMITS_URL"] = url
            result = subprocess.run([sys.executable, "-m", "lanes.cli", "check", "--no-redis"], env=env,
                                    capture_output=True, text=True, timeout=60)
            codes[name] = result.returncode
            assert "Traceback" not in result.stderr and "farm limit" in result.stderr, result.stderr
    assert codes == {"text": 2, "json": 2}


def test_a_narrow_lane_is_reported_with_advice_that_fits_its_pool(db_url, one_redis_url, tmp_path):
    engine, settings, client = setup(db_url, one_redis_url, tmp_path)
    # gpu0 (no controller) runs 3 of s0's 4; gpu1 (a controller, ceiling 1) can never reach s1's 2.
    doc = document(widths={"gpu0": 3, "gpu1": 1})
    doc["pools"][1].update(floor=1, ceiling=1, controller={"kind": "overload"})
    apply_document(engine, doc)
    report = run_check(engine, settings, client)
    found = {m.key: m.message for m in report.mismatches}
    assert set(found) == {"pool_under_services:gpu0", "pool_under_services:gpu1"}
    assert found["pool_under_services:gpu0"].endswith("raise its width to 4")
    assert "raise the ceiling to 2" in found["pool_under_services:gpu1"]
    assert "ceiling" not in found["pool_under_services:gpu0"]
    engine.dispose()


def test_a_live_width_past_the_services_of_a_pool_without_a_controller_advises_no_ceiling(db_url, one_redis_url,
                                                                                          tmp_path):
    engine, settings, client = setup(db_url, one_redis_url, tmp_path)
    apply_document(engine, document())
    lane = pool_lane(client, settings, load_routing(engine).pools["gpu0"])
    lane.provision()
    lane.resize(7)  # set by hand: no controller moves gpu0
    (mismatch,) = run_check(engine, settings, client).mismatches
    assert mismatch.kind == "controller_over_services"
    assert "ceiling" not in mismatch.message and "set it back to 4" in mismatch.message
    engine.dispose()


def test_a_fleet_supervisor_checks_the_lane_config_at_its_start_and_on_every_reload(isolated_env, one_redis_url,
                                                                                    monkeypatch):
    # Seed 004: not only the active beat; every process checks at start and on reload.
    import threading

    from lanes.catalog import open_catalog
    from lanes.settings import load_settings
    from tests.polling import eventually
    from workers.supervisor import FleetSupervisor

    monkeypatch.setenv("LANES_REDIS_URL", one_redis_url)
    settings = load_settings()
    engine = open_catalog(settings)
    apply_document(engine, document(widths={"gpu0": 6}))
    said: list[str] = []
    supervisor = FleetSupervisor(settings, "gpu0", poll_seconds=0.2, echo=said.append)
    thread = threading.Thread(target=supervisor.run)
    thread.start()
    try:
        eventually(lambda: any(line.startswith("lane config (fleet gpu0 start): pool 'gpu0' has width 6")
                               for line in said), timeout=60, what="the check at start")
        apply_document(engine, document(widths={"gpu0": 4, "gpu1": 1}))
        eventually(lambda: any(line.startswith("lane config (fleet gpu0 reload): pool 'gpu1' is narrower")
                               for line in said), timeout=60, what="the check on reload")
    finally:
        supervisor.stop()
        thread.join(90)
    assert ("cleared", "pool_over_services:gpu0") in transitions(engine)
    engine.dispose()

"""``catalog apply --prune`` against the live system (real Redis lanes, real
Celery queues), and reading commands that refuse a catalog with no tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from lanes.catalog import load_routing, make_engine
from lanes.celery_client import ROUTE_TASK, fleet_queues, make_celery
from lanes.cli import main
from lanes.routing.runtime import pool_lane, provision_lanes
from lanes.settings import load_settings

TWO_POOLS = {
    "pools": [{"name": "keep-gpu", "width": 2}, {"name": "busy-gpu", "width": 2}],
    "models": [
        {"name": "keep-7b", "base_url": "http://keep:8000/v1", "pool": "keep-gpu"},
        {"name": "busy-7b", "base_url": "http://busy:8000/v1", "pool": "busy-gpu"},
    ],
    "workflows": [{"name": "keep", "candidates": ["keep-7b"]}, {"name": "busy", "candidates": ["busy-7b"]}],
}
ONE_POOL = {
    "pools": TWO_POOLS["pools"][:1],
    "models": TWO_POOLS["models"][:1],
    "workflows": TWO_POOLS["workflows"][:1],
}


@pytest.fixture
def lanes(isolated_env, db_url, one_redis_url, monkeypatch, tmp_path):
    monkeypatch.setenv("LANES_DATABASE_URL", db_url)
    monkeypatch.setenv("LANES_REDIS_URL", one_redis_url)
    runner = CliRunner()

    def run(*args: str, document: dict | None = None):
        if document is not None:
            path = tmp_path / f"catalog-{len(list(tmp_path.glob('catalog-*')))}.yaml"
            path.write_text(json.dumps(document))
            args = (*args, str(path))
        return runner.invoke(main, list(args), catch_exceptions=False)

    return run


def pool_names(db_url: str) -> list[str]:
    engine = make_engine(db_url)
    try:
        return sorted(load_routing(engine).pools)
    finally:
        engine.dispose()


def hold_a_slot(db_url: str, redis_url: str):
    settings = load_settings()
    engine = make_engine(db_url)
    client = redis.Redis.from_url(redis_url)
    try:
        table = load_routing(engine)
        provision_lanes(client, settings, table)
        lane = pool_lane(client, settings, table.pools["busy-gpu"])
        return lane, lane.try_acquire("interactive")
    finally:
        engine.dispose()


def test_a_pool_with_a_slot_held_is_not_pruned_without_force(lanes, db_url, one_redis_url):
    assert lanes("catalog", "apply", document=TWO_POOLS).exit_code == 0
    lane, permit = hold_a_slot(db_url, one_redis_url)
    assert permit is not None
    try:
        refused = lanes("catalog", "apply", "--prune", document=ONE_POOL)
        assert refused.exit_code == 2
        assert "refusing to prune: pool busy-gpu is in use (1 holding a slot)" in refused.output
        assert "--force" in refused.output
        assert pool_names(db_url) == ["busy-gpu", "keep-gpu"]

        shown = lanes("catalog", "apply", "--prune", "--dry-run", document=ONE_POOL)
        assert shown.exit_code == 0
        assert "- pool busy-gpu  (in use: 1 holding a slot)" in shown.output
        assert "dry run: refusing to prune" in shown.output
        assert pool_names(db_url) == ["busy-gpu", "keep-gpu"]

        forced = lanes("catalog", "apply", "--prune", "--force", document=ONE_POOL)
        assert forced.exit_code == 0 and "- pool busy-gpu" in forced.output
        assert pool_names(db_url) == ["keep-gpu"]
    finally:
        lane.release(permit)
        lane.close()


def test_a_pool_with_queued_tasks_is_not_pruned_without_force(lanes, db_url, one_redis_url):
    assert lanes("catalog", "apply", document=TWO_POOLS).exit_code == 0
    app = make_celery(load_settings(), one_redis_url)
    for _ in range(3):
        app.send_task(ROUTE_TASK, kwargs={"workflow": "busy"}, queue=fleet_queues("busy-gpu")[0])

    refused = lanes("catalog", "apply", "--prune", document=ONE_POOL)

    assert refused.exit_code == 2 and "pool busy-gpu is in use (3 queued task(s))" in refused.output
    assert pool_names(db_url) == ["busy-gpu", "keep-gpu"]


def test_an_idle_pool_is_pruned(lanes, db_url):
    assert lanes("catalog", "apply", document=TWO_POOLS).exit_code == 0

    pruned = lanes("catalog", "apply", "--prune", document=ONE_POOL)

    assert pruned.exit_code == 0 and "- pool busy-gpu" in pruned.output
    assert pool_names(db_url) == ["keep-gpu"]


def test_a_prune_that_empties_the_catalog_needs_force(lanes, db_url):
    assert lanes("catalog", "apply", document=TWO_POOLS).exit_code == 0

    refused = lanes("catalog", "apply", "--prune", document={})
    assert refused.exit_code == 2 and "would empty the catalog" in refused.output
    assert pool_names(db_url) == ["busy-gpu", "keep-gpu"]

    shown = lanes("catalog", "apply", "--prune", "--dry-run", document={})
    assert shown.exit_code == 0 and "- pool keep-gpu" in shown.output and "would empty the catalog" in shown.output

    assert lanes("catalog", "apply", "--prune", "--force", document={}).exit_code == 0
    assert pool_names(db_url) == []


def test_a_prune_that_cannot_reach_redis_is_exit_3(lanes, db_url, monkeypatch):
    assert lanes("catalog", "apply", document=TWO_POOLS).exit_code == 0
    monkeypatch.setenv("LANES_REDIS_URL", "redis://127.0.0.1:1/0")

    result = lanes("catalog", "apply", "--prune", document=ONE_POOL)

    assert result.exit_code == 3 and "pass --force" in result.output
    assert pool_names(db_url) == ["busy-gpu", "keep-gpu"]


# --- reading a catalog that was never created ---------------------------------------


@pytest.mark.parametrize(
    "command",
    [("catalog", "show"), ("catalog", "export"), ("pools", "show"), ("worker", "--list"), ("check",),
     ("submit", "dialog", "--payload", '{"messages": [{"role": "user", "content": "hi"}]}')],
)
def test_a_misspelt_sqlite_path_is_refused_and_not_created(isolated_env, tmp_path, monkeypatch, command):
    misspelt = tmp_path / "catalgo.db"
    monkeypatch.setenv("LANES_DATABASE_URL", f"sqlite:///{misspelt}")

    result = CliRunner().invoke(main, list(command))

    assert result.exit_code == 2
    assert "has no catalog tables" in result.output and "lanes db upgrade" in result.output
    assert not misspelt.exists()


def test_a_database_with_no_schema_is_refused_by_readers(isolated_env, db_url, monkeypatch):
    monkeypatch.setenv("LANES_DATABASE_URL", db_url)
    if db_url.startswith("sqlite"):
        Path(db_url[len("sqlite:///"):]).touch()  # an empty file, as a stray connect leaves

    shown = CliRunner().invoke(main, ["catalog", "show"])

    assert shown.exit_code == 2 and "lanes db upgrade" in shown.output
    assert CliRunner().invoke(main, ["db", "upgrade"]).exit_code == 0
    assert CliRunner().invoke(main, ["catalog", "show"]).exit_code == 0

"""PATCH /v1/pools and /v1/workflows: omitted unchanged, null restores the default,
validated as the catalog file is, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
import redis

from lanes.catalog import load_routing, open_catalog
from lanes.ops.patch import POOLS, patch_item
from lanes.pools import pool_lane
from tests.api.conftest import AUTH


@pytest.fixture
def api(make_api, db_url):
    return make_api(database_url=db_url)


def live_width(api, pool_name: str) -> int:
    client = api.app.state.client
    pool = load_routing(client.engine).pools[pool_name]
    return pool_lane(redis.Redis.from_url(client.settings.redis_url), client.settings, pool).stats().width


def test_a_width_patch_changes_only_the_width_and_reaches_the_live_lane(api):
    before = api.get("/v1/pools/gpu-a").json()
    answer = api.patch("/v1/pools/gpu-a", json={"width": 5}, headers=AUTH)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["pool"]["configured_width"] == 5 and body["pool"]["width"] == 5
    assert body["changes"] == [
        {"action": "update", "kind": "pool", "name": "gpu-a", "fields": {"width": {"old": 2, "new": 5}}}
    ]
    assert body["catalog"]["ceiling"] == 8 and body["catalog"]["controller"] == {"kind": "off"}
    assert body["catalog_version"] > 0
    assert live_width(api, "gpu-a") == 5, "the live lane follows before the answer is sent"
    assert before["configured_width"] == 2


def test_null_restores_the_file_default_and_leaves_the_rest(api):
    answer = api.patch("/v1/pools/gpu-b", json={"controller": None, "ceiling": None}, headers=AUTH)
    assert answer.status_code == 200, answer.text
    catalog = answer.json()["catalog"]
    assert catalog["controller"] == {"kind": "off"}, "null restores the default controller (off)"
    assert catalog["ceiling"] == 3, "no ceiling in a file means max(width, floor)"
    assert (catalog["width"], catalog["floor"]) == (3, 2), "omitted fields are unchanged"
    assert answer.json()["pool"]["controllers"] == {}


def test_a_controller_patch_is_validated_as_the_file_is_and_fills_defaults(api):
    bad = api.patch("/v1/pools/gpu-a", json={"controller": {"kind": "overload", "cut_factor": 7}}, headers=AUTH)
    assert bad.status_code == 400
    assert bad.json()["message"] == "controller.cut_factor: 7 is outside (0, 1]"
    good = api.patch("/v1/pools/gpu-a", json={"controller": {"kind": "overload", "cut_factor": 0.5}}, headers=AUTH)
    assert good.status_code == 200, good.text
    controller = good.json()["catalog"]["controller"]
    assert controller["kind"] == "overload" and controller["cut_factor"] == 0.5 and controller["statuses"] == [529]
    assert set(good.json()["pool"]["controllers"]) == {"overload"}


def test_bad_values_are_refused_by_name_and_nothing_is_written(api):
    version = api.get("/v1/pools/gpu-a").json()
    cases = [
        ({"width": 0}, 400, "width: 0 is not a width >= 1"),
        ({"width": 9}, 400, "width: 9 is outside floor..ceiling 1..8"),
        ({"width": "4"}, 400, "width: '4' is not an integer"),
        ({"width": None}, 400, "pool field 'width' has no default to restore"),
        ({"name": "gpu-z"}, 400, "pool field 'name' cannot be changed here"),
        ({"colour": "red"}, 400, "pool field 'colour' cannot be changed here (fields: ceiling, controller, enabled, "
                                 "endpoints, floor, metrics_url, width)"),
    ]
    for body, status, words in cases:
        answer = api.patch("/v1/pools/gpu-a", json=body, headers=AUTH)
        assert answer.status_code == status, (body, answer.text)
        assert words in answer.json()["message"], (body, answer.json())
    assert api.get("/v1/pools/gpu-a").json() == version
    assert live_width(api, "gpu-a") == 2


def test_an_unknown_pool_or_workflow_is_404_naming_the_known_ones(api):
    for path in ("/v1/pools/gpu-z", "/v1/workflows/chit"):
        answer = api.patch(path, json={"width": 3} if "pools" in path else {"reserve_ms": 1}, headers=AUTH)
        assert answer.status_code == 404
        assert answer.json()["error"] == "not_found"
    assert api.get("/v1/pools/gpu-z").json()["message"] == "unknown pool 'gpu-z' (known: gpu-a, gpu-b)"


def test_a_workflow_patch_keeps_omitted_fields_and_null_restores_defaults(api):
    answer = api.patch("/v1/workflows/chat", json={"deadline_ms": None, "priority": "user_tool"}, headers=AUTH)
    assert answer.status_code == 200, answer.text
    workflow = answer.json()["workflow"]
    assert workflow == {"name": "chat", "priority": "user_tool", "reserve_ms": 200, "deadline_ms": None,
                        "candidates": ["a", "b"], "failover": None}
    assert api.patch("/v1/workflows/chat", json={"priority": None}, headers=AUTH).json()["workflow"]["priority"] == (
        "interactive")
    refused = api.patch("/v1/workflows/chat", json={"candidates": ["a", "zz"]}, headers=AUTH)
    assert refused.status_code == 400
    assert "candidates[1]: 'zz' is not a model in this file" in refused.json()["message"]
    mixed = api.patch("/v1/workflows/chat", json={"candidates": ["a", "e"]}, headers=AUTH)
    assert "'e' is an embedding model but the primary 'a' is a chat model" in mixed.json()["message"]
    assert api.get("/v1/workflows/chat").json()["candidates"] == ["a", "b"]


def test_a_patch_planned_on_a_stale_catalog_is_planned_again_not_written_over(api, monkeypatch):
    """Another writer moving the catalog between the read and the write is kept."""
    import lanes.ops.patch as patch_module

    engine = open_catalog(api.app.state.client.settings, create=False)
    real_read = patch_module.read_catalog
    moved = []

    def read_then_someone_writes(eng):
        state = real_read(eng)
        if not moved:
            moved.append(True)
            patch_item(engine, POOLS, "gpu-b", {"width": 4})  # the other writer
        return state

    monkeypatch.setattr(patch_module, "read_catalog", read_then_someone_writes)
    try:
        patch_item(engine, POOLS, "gpu-a", {"width": 3})
        table = load_routing(engine)
    finally:
        engine.dispose()
    assert (table.pools["gpu-a"].width, table.pools["gpu-b"].width) == (3, 4)


def test_a_failover_patch_has_the_seeds_semantics_over_http(api):
    """The failover share's override (seed 003): an object replaces the old one whole,
    {"enabled": false} turns it off, null restores the defaults, omitted keeps it."""
    first = api.patch("/v1/workflows/chat", json={"failover": {"dwell_ms": 500, "share_floor": 0.2}}, headers=AUTH)
    assert first.status_code == 200, first.text
    assert first.json()["workflow"]["failover"] == {"dwell_ms": 500, "share_floor": 0.2}
    second = api.patch("/v1/workflows/chat", json={"failover": {"latency_budget_ms": 2000}}, headers=AUTH)
    assert second.json()["workflow"]["failover"] == {"latency_budget_ms": 2000}
    kept = api.patch("/v1/workflows/chat", json={"reserve_ms": 100}, headers=AUTH)
    assert kept.json()["workflow"]["failover"] == {"latency_budget_ms": 2000}
    off = api.patch("/v1/workflows/chat", json={"failover": {"enabled": False}}, headers=AUTH)
    assert off.json()["workflow"]["failover"] == {"enabled": False}
    assert api.patch("/v1/workflows/chat", json={"failover": None}, headers=AUTH).json()["workflow"]["failover"] is None
    refused = api.patch("/v1/workflows/chat", json={"failover": {"share_decay": 1.5}}, headers=AUTH)
    assert refused.status_code == 400
    assert "failover.share_decay: 1.5 is outside (0, 1)" in refused.json()["message"]
    assert api.get("/v1/workflows/chat").json()["failover"] is None  # the refusal changed nothing

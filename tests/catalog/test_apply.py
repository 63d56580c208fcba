"""Applying documents: idempotent upserts, dry runs, pruning, renames, export,
and the routing table the routing layer reads."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from lanes.catalog import (
    apply_document,
    catalog_version,
    dump,
    export_document,
    load_routing,
    migrate,
    record_event,
    recent_events,
    refresh,
)
from lanes.catalog.files import parse
from lanes.priority import Priority
from tests.catalog.conftest import EXAMPLE, snapshot


def example() -> dict:
    return tomllib.loads(EXAMPLE.read_text())


def test_applying_the_example_twice_writes_once(engine):
    first = apply_document(engine, example())
    assert {(c.action, c.kind) for c in first.changes} == {
        ("create", "pool"), ("create", "model"), ("create", "workflow"), ("create", "service")
    }
    assert first.version == catalog_version(engine) == 1
    before = snapshot(engine)

    second = apply_document(engine, example())

    assert second.empty and second.version == 1
    assert snapshot(engine) == before


def test_a_dry_run_reports_the_changes_and_writes_nothing(engine):
    apply_document(engine, example())
    before = snapshot(engine)
    document = example()
    document["pools"][0]["width"] = 6

    plan = apply_document(engine, document, dry_run=True)

    assert plan.lines() == ["~ pool aifarm-gpu0-dialog: width 4 -> 6"]
    assert snapshot(engine) == before and catalog_version(engine) == 1


def test_one_changed_width_is_one_update_and_one_version_bump(engine):
    apply_document(engine, example())
    document = example()
    document["pools"][3]["width"] = 12
    document["pools"][3]["controller"] = {"kind": "overload", "cut_factor": 0.5}

    changes = apply_document(engine, document)

    assert [c.name for c in changes.changes] == ["aifarm-embedder"]
    assert catalog_version(engine) == 2
    pool = load_routing(engine).pools["aifarm-embedder"]
    assert pool.width == 12
    # Defaults are filled in, so the catalog shows the settings in effect.
    assert pool.controller == {"kind": "overload", "cut_factor": 0.5, "growth_factor": 1.5,
                               "interval_seconds": 5.0, "probe_fraction": 0.05, "statuses": [529],
                               "probe_backoff": 8, "max_probe_backoff": 128}
    assert pool.controllers == {"overload": {"cut_factor": 0.5, "growth_factor": 1.5, "interval_seconds": 5.0,
                                             "probe_fraction": 0.05, "statuses": [529],
                                             "probe_backoff": 8, "max_probe_backoff": 128}}


def test_without_prune_unnamed_rows_stay_and_with_prune_they_go(engine):
    with_spare = example()
    with_spare["services"].append({"name": "spare", "limit": 1})
    apply_document(engine, with_spare)
    document = example()
    document["workflows"] = [w for w in document["workflows"] if w["name"] != "youtube"]

    assert apply_document(engine, document).empty
    assert "youtube" in load_routing(engine).workflows

    pruned = apply_document(engine, document, prune=True)

    assert pruned.lines() == ["- workflow youtube", "- service spare"]
    table = load_routing(engine)
    assert "youtube" not in table.workflows and "spare" not in table.services


def test_prune_removes_pools_and_models_after_the_workflows_using_them(engine):
    apply_document(engine, example())
    small = {
        "pools": [example()["pools"][0]],
        "models": [example()["models"][0]],
        "workflows": [{"name": "dialog", "priority": "interactive", "reserve_ms": 0, "candidates": ["dialog-27b"]}],
        "services": [{"name": "llm-dialog", "limit": 4}],
    }
    apply_document(engine, small, prune=True)
    table = load_routing(engine)
    assert list(table.pools) == ["aifarm-gpu0-dialog"] and list(table.models) == ["dialog-27b"]
    assert [m.name for m in table.workflows["dialog"].candidates] == ["dialog-27b"]
    assert table.services == {"llm-dialog": 4}


def test_a_pool_renamed_through_previous_names_keeps_its_id(engine):
    apply_document(engine, example())
    old_id = load_routing(engine).pools["aifarm-gpu2-utility"].id
    document = example()
    document["pools"][1]["name"] = "aifarm-gpu2-reasoning"
    document["pools"][1]["previous_names"] = ["reasoner-gpu", "aifarm-gpu2-utility"]
    for model in document["models"]:
        if model.get("pool") == "aifarm-gpu2-utility":
            model["pool"] = "aifarm-gpu2-reasoning"

    changes = apply_document(engine, document, prune=True)

    assert [c.action for c in changes.changes] == ["update"] + ["update"]  # the pool, then its one model
    table = load_routing(engine)
    assert table.pools["aifarm-gpu2-reasoning"].id == old_id
    assert table.workflows["memory_extraction"].fleet == "aifarm-gpu2-reasoning"


@pytest.mark.parametrize("fmt", ["toml", "yaml"])
def test_an_export_reapplies_as_a_no_op(engine, fmt):
    apply_document(engine, example())
    document = example()
    document["pools"][0]["controller"] = [{"kind": "vllm", "scrape_seconds": 3}, {"kind": "overload", "statuses": [429, 529]}]
    document["pools"][0]["metrics_url"] = "http://127.0.0.1:8700/metrics"
    apply_document(engine, document)
    before = snapshot(engine)

    text = dump(export_document(engine), fmt)
    changes = apply_document(engine, parse(text, fmt))

    assert changes.empty and snapshot(engine) == before


def test_the_example_is_exactly_what_the_fleet_revisions_build(db_url, engine):
    migrate.upgrade(db_url, "fleet@head")
    assert apply_document(engine, example()).empty


def test_the_example_applied_over_the_old_fleet_renames_pools_in_place(db_url, engine):
    migrate.upgrade(db_url, "fleet_0002")
    old = {name: info.id for name, info in load_routing(engine).pools.items()}

    apply_document(engine, example())

    pools = load_routing(engine).pools
    assert pools["aifarm-gpu0-dialog"].id == old["dialog-gpu"]
    assert pools["aifarm-gpu1-privacy"].id == old["privacy"] and pools["aifarm-gpu1-privacy"].width == 4


def test_the_routing_table_holds_the_reference_fleet(engine):
    apply_document(engine, example())
    table = load_routing(engine)

    dialog = table.workflows["dialog"]
    assert dialog.priority is Priority.INTERACTIVE and dialog.reserve_seconds == 30.0
    assert [m.name for m in dialog.candidates] == ["dialog-27b", "utility-14b", "hosted-fallback"]
    assert dialog.fleet == "aifarm-gpu0-dialog" and dialog.default_deadline_seconds == 120.0
    hosted = table.models["hosted-fallback"]
    assert hosted.pool is None and hosted.api_key_env == "LANES_HOSTED_API_KEY"
    for name in ("history_summary", "youtube", "media_optimizer", "image", "music"):
        assert table.workflows[name].priority is Priority.USER_TOOL
    for name in ("memory_extraction", "subject_merge"):
        assert table.workflows[name].priority is Priority.BACKGROUND and table.workflows[name].reserve_seconds == 0
    media = {table.workflows[name].fleet for name in ("image", "music", "speech_recognition")}
    assert media == {"aifarm-gpu1-media"} and table.pools["aifarm-gpu1-media"].width == 1
    assert table.workflows["embeddings"].fleet == "aifarm-embedder" and table.pools["aifarm-embedder"].width == 8
    assert table.workflows["redaction"].fleet == "aifarm-gpu1-privacy"
    assert table.models["embed-m3"].kind == "embedding" and table.models["dialog-27b"].timeout_seconds == 120.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        dialog.reserve_seconds = 0  # type: ignore[misc]
    assert hash(table.models["dialog-27b"])  # usable as a dict key


def test_refresh_reloads_only_when_the_version_moves(engine):
    apply_document(engine, example())
    table = load_routing(engine)
    assert refresh(engine, table) is table
    record_event(engine, "lane_bypass", pool="aifarm-gpu0-dialog")  # events are not catalog changes
    assert refresh(engine, table) is table
    document = example()
    document["services"][0]["limit"] = 5
    apply_document(engine, document)
    fresh = refresh(engine, table)
    assert fresh is not table and fresh.version == table.version + 1 and fresh.services["llm-dialog"] == 5


def test_a_hand_edit_can_announce_itself_by_bumping_the_version(engine):
    from lanes.catalog.version import bump_version

    assert bump_version(engine) == 1 and catalog_version(engine) == 1


def test_events_keep_only_the_newest_rows(engine):
    for n in range(7):
        record_event(engine, "lane_config_mismatch", pool="p", workflow="w", detail={"n": n}, keep=3)
    events = recent_events(engine)
    assert [e.detail["n"] for e in events] == [6, 5, 4]
    assert events[0].kind == "lane_config_mismatch" and events[0].pool == "p" and events[0].at is not None

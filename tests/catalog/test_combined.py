"""An apply validates the catalog that would result, not only the file."""

from __future__ import annotations

import pytest

from lanes.catalog import apply_document, dump, export_document, load_routing
from lanes.catalog.files import parse
from lanes.errors import CatalogInvalid
from tests.catalog.conftest import snapshot

FIRST = {
    "pools": [{"name": "gpu-a", "width": 2}, {"name": "gpu-b", "width": 2}],
    "models": [
        {"name": "shared", "base_url": "http://127.0.0.1:8700/v1", "pool": "gpu-a", "timeout_ms": 60_000},
        {"name": "other", "base_url": "http://127.0.0.1:8700/v1", "pool": "gpu-a", "timeout_ms": 60_000},
    ],
    "workflows": [
        {"name": "w1", "candidates": ["shared", "other"], "failover": {"latency_budget_ms": 20_000}},
        {"name": "w2", "candidates": ["other"]},
    ],
}


def second(**shared) -> dict:
    """A second file that says something else about ``shared`` (and nothing of w1)."""
    model = {"name": "shared", "base_url": "http://127.0.0.1:8700/v1", "pool": "gpu-a", "timeout_ms": 60_000}
    return {
        "pools": [{"name": "gpu-a", "width": 2}, {"name": "gpu-b", "width": 2}],
        "models": [{**model, **shared}],
    }


def test_a_second_file_that_makes_a_workflow_mix_model_kinds_is_refused_naming_both_sides(engine):
    apply_document(engine, FIRST)
    before = snapshot(engine)

    with pytest.raises(CatalogInvalid) as refused:
        apply_document(engine, second(kind="embedding", pool="gpu-b", timeout_ms=5_000))

    problems = refused.value.problems
    kinds = [p for p in problems if "embedding model but the primary" in p or "is a chat model" in p]
    assert kinds and all("workflow 'w1' (already in the catalog, not in this file)" in p for p in kinds), problems
    assert all("this file's model 'shared'" in p for p in kinds), problems
    budget = [p for p in problems if "latency_budget_ms: 20000 is above the primary 'shared'" in p]
    assert len(budget) == 1 and "(already in the catalog, not in this file)" in budget[0], problems
    assert snapshot(engine) == before


def test_a_second_file_shortening_the_primarys_timeout_below_the_budget_is_refused(engine):
    apply_document(engine, FIRST)

    with pytest.raises(CatalogInvalid, match=r"workflow 'w1' \(already in the catalog.*timeout_ms 5000"):
        apply_document(engine, second(timeout_ms=5_000), dry_run=True)


def test_what_one_file_may_change_alone_still_applies_and_the_export_reapplies(engine):
    apply_document(engine, FIRST)

    changes = apply_document(engine, second(timeout_ms=30_000))

    assert [line for line in changes.lines()] == ["~ model shared: timeout_ms 60000 -> 30000"]
    exported = export_document(engine)
    assert apply_document(engine, parse(dump(exported, "toml"), "toml")).empty


def test_a_workflow_whose_primary_moves_pool_shows_its_fleet_moving(engine):
    apply_document(engine, FIRST)

    changes = apply_document(engine, second(pool="gpu-b"))

    assert "~ workflow w1: fleet 'gpu-a' -> 'gpu-b'" in changes.lines(), changes.lines()
    assert load_routing(engine).workflows["w1"].fleet == "gpu-b"


def test_a_pool_renamed_in_place_does_not_count_as_a_move(engine):
    apply_document(engine, FIRST)
    renamed = {"pools": [{"name": "gpu-a2", "width": 2, "previous_names": ["gpu-a"]}]}

    changes = apply_document(engine, renamed)

    assert changes.lines() == ["~ pool gpu-a2: name 'gpu-a' -> 'gpu-a2'"] or all(
        "fleet" not in line for line in changes.lines()
    ), changes.lines()


def test_a_problem_the_catalog_already_had_does_not_block_an_unrelated_change(engine):
    # Given a catalog that an older version let become invalid (written directly)
    apply_document(engine, FIRST)
    import sqlalchemy as sa

    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE models SET kind = 'embedding' WHERE name = 'shared'"))

    # When an unrelated workflow changes, it goes through
    changes = apply_document(engine, {"pools": FIRST["pools"], "models": FIRST["models"][1:], "workflows": [
        {"name": "w2", "candidates": ["other"], "reserve_ms": 5}]})
    assert changes.lines() == ["~ workflow w2: reserve_ms 0 -> 5"]

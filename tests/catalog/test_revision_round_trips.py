"""Every revision keeps the catalog's data through downgrade -> upgrade, on both databases.

What a revision removes by design is named in its docstring and said, line by
line, by the downgrade (``lanes db downgrade --dry-run`` shows it first).
"""

from __future__ import annotations

import tomllib

import pytest
from click.testing import CliRunner

from lanes.catalog import apply_document, export_document, make_engine, migrate
from lanes.cli import main
from tests.catalog.conftest import EXAMPLE, snapshot

# Revisions whose downgrade drops what they created, by design (their docstrings
# say so): the first of each branch. Every other revision is walked.
ROOTS = {"catalog_0001", "fleet_0001", "memory_0001"}


def every_optional_field() -> dict:
    """The example fleet, plus an item using each optional key the file format has."""
    document = tomllib.loads(EXAMPLE.read_text())
    document["pools"].append({
        "name": "spare-gpu", "width": 2, "floor": 1, "ceiling": 4, "enabled": False,
        "metrics_url": "http://127.0.0.1:9100/metrics",
        "controller": [{"kind": "vllm", "max_cut": 0.25}, {"kind": "overload", "statuses": [429, 529]}],
        "previous_names": ["old-spare", "older-spare"],
    })
    document["models"] += [
        {"name": "spare-chat", "base_url": "http://127.0.0.1:8701/v1", "kind": "chat", "pool": "spare-gpu",
         "service": "spare", "timeout_ms": 45_000, "api_key_env": "LANES_SPARE_KEY"},
        {"name": "spare-embed", "base_url": "http://127.0.0.1:8701/v1", "kind": "embedding", "timeout_ms": 9_000},
        {"name": "spare-hosted", "base_url": "http://127.0.0.1:8702/v1", "concurrency": 16},
    ]
    document["services"].append({"name": "spare", "limit": 3})
    document["workflows"] += [
        {"name": "tuned", "priority": "background", "reserve_ms": 2_000, "deadline_ms": 90_000,
         "candidates": ["spare-chat", "hosted-fallback"],
         "failover": {"latency_budget_ms": 4_000, "share_floor": 0.1, "overload_statuses": [429, 503]}},
        {"name": "plain-order", "priority": "user_tool", "candidates": ["dialog-27b", "hosted-fallback"],
         "failover": {"enabled": False}},
    ]
    return document


def walked_revisions() -> list[tuple[str, str]]:
    """(revision, the one below it) for every revision that is not a branch's first."""
    script = migrate.script_directory()
    return [
        (rev.revision, rev.down_revision)
        for rev in script.walk_revisions()
        if rev.revision not in ROOTS and isinstance(rev.down_revision, str)
    ]


def test_the_walk_covers_every_revision_but_the_roots():
    walked = {revision for revision, _ in walked_revisions()}
    assert walked | ROOTS == {r.revision for r in migrate.all_revisions()}
    assert {"catalog_0002", "catalog_0003", "catalog_0004", "catalog_0005", "fleet_0002", "fleet_0003", "fleet_0004"} <= walked


def test_each_revision_down_then_up_keeps_every_field_of_the_catalog(db_url):
    engine = make_engine(db_url)
    try:
        # Given the fleet's revisions, then the example with every optional field over them
        migrate.upgrade(db_url, "schema@head")
        migrate.upgrade(db_url, "fleet@head")
        migrate.upgrade(db_url, "memory@head")
        apply_document(engine, every_optional_field())
        exported = export_document(engine)
        candidates = snapshot(engine, ("workflow_candidates",))
        assert len(candidates["workflow_candidates"]) == 20

        for revision, below in walked_revisions():
            # When the revision (and those above it on its branch) is taken
            # down, and every branch brought up again
            migrate.downgrade(db_url, below)
            assert revision not in migrate.applied_revisions(
                migrate.script_directory(), migrate.current_heads(engine)
            )
            for target in ("schema@head", "fleet@head"):
                migrate.upgrade(db_url, target)

            # Then the catalog exports exactly as before, candidates included
            assert export_document(engine) == exported, f"down/up of {revision} changed the catalog"
            assert snapshot(engine, ("workflow_candidates",)) == candidates, revision
    finally:
        engine.dispose()


def test_a_schema_step_down_keeps_every_workflows_candidates(db_url):
    # The reported case: the example, `db downgrade schema@-1`, `db upgrade`
    engine = make_engine(db_url)
    try:
        migrate.upgrade(db_url, "schema@head")
        apply_document(engine, tomllib.loads(EXAMPLE.read_text()))
        before = export_document(engine)

        migrate.downgrade(db_url, "schema@-1")
        migrate.upgrade(db_url, "schema@head")

        after = export_document(engine)
        assert all(workflow["candidates"] for workflow in after["workflows"])
        assert after == before
    finally:
        engine.dispose()


def test_a_downgrade_dry_run_names_the_overrides_the_schema_below_cannot_hold(isolated_env, db_url, monkeypatch):
    monkeypatch.setenv("LANES_DATABASE_URL", db_url)
    engine = make_engine(db_url)
    try:
        migrate.upgrade(db_url, "schema@head")
        apply_document(engine, every_optional_field())
        before = snapshot(engine)
        runner = CliRunner()

        dry = runner.invoke(main, ["db", "downgrade", "catalog_0002", "--dry-run"])

        assert dry.exit_code == 0, dry.output
        assert snapshot(engine) == before
        removed = [line for line in dry.output.splitlines() if "loses its failover override" in line]
        assert len(removed) == 2, dry.output
        assert any("(tuned)" in line and "'latency_budget_ms': 4000" in line for line in removed)
        assert any("(plain-order)" in line and "'enabled': False" in line for line in removed)

        # The real downgrade says the same; the upgrade puts them back
        real = runner.invoke(main, ["db", "downgrade", "catalog_0002"])
        assert real.exit_code == 0 and real.output.count("loses its failover override") == 2
        assert runner.invoke(main, ["db", "upgrade"]).exit_code == 0
        assert snapshot(engine) == before
    finally:
        engine.dispose()


@pytest.mark.parametrize("renamed", [True, False])
def test_an_override_whose_workflow_changed_while_down_is_named_not_misplaced(db_url, renamed):
    engine = make_engine(db_url)
    try:
        migrate.upgrade(db_url, "schema@head")
        apply_document(engine, every_optional_field())
        migrate.downgrade(db_url, "catalog_0002")
        import sqlalchemy as sa

        with engine.begin() as conn:
            if renamed:
                conn.execute(sa.text("UPDATE workflows SET name = 'retuned' WHERE name = 'tuned'"))
            else:
                conn.execute(sa.text("DELETE FROM workflows WHERE name = 'tuned'"))
        reports: list[str] = []

        migrate.upgrade(db_url, "schema@head", progress=reports.append)

        assert any("(tuned) is gone or renamed" in line for line in reports), reports
        failover = {w["name"]: w["failover"] for w in export_document(engine)["workflows"]}
        assert failover.get("retuned") is None and failover["plain-order"] == {"enabled": False}
    finally:
        engine.dispose()


def test_a_dry_run_down_to_base_says_how_many_rows_the_first_revision_drops(isolated_env, db_url, monkeypatch):
    monkeypatch.setenv("LANES_DATABASE_URL", db_url)
    engine = make_engine(db_url)
    try:
        migrate.upgrade(db_url, "schema@head")
        apply_document(engine, tomllib.loads(EXAMPLE.read_text()))
        before = snapshot(engine)

        dry = CliRunner().invoke(main, ["db", "downgrade", "base", "--dry-run"])

        assert dry.exit_code == 0, dry.output
        assert ("catalog_0001 downgrade: drops every catalog table with its rows "
                "(5 pools, 8 models, 11 workflows, 16 workflow_candidates, 7 services, 0 events)") in dry.output
        assert snapshot(engine) == before
    finally:
        engine.dispose()

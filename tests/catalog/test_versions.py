"""Versions that cannot repeat, exports that always re-apply, migrations that
undo what they did, and a re-apply that stays linear in the number of pools."""

from __future__ import annotations

import json
import sys
import tomllib

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from lanes.catalog import apply_document, dump, export_document, load_routing, make_engine, migrate, refresh
from lanes.catalog.files import parse
from lanes.catalog.state import pools_t
from lanes.cli import main
from tests.catalog.conftest import EXAMPLE, snapshot


def example() -> dict:
    return tomllib.loads(EXAMPLE.read_text())


def pools(*names: str) -> dict:
    return {"pools": [{"name": name, "width": 1} for name in names]}


# --- 9: (identity, version) -------------------------------------------------------


def test_a_catalog_created_again_at_the_same_version_is_reloaded(db_url):
    # Given a worker holding version 1 of a catalog
    migrate.upgrade(db_url, "schema@head")
    engine = make_engine(db_url)
    try:
        apply_document(engine, pools("old-gpu"))
        held = load_routing(engine)
        assert held.version == 1

        # When the catalog is dropped, created again and given other pools, at version 1 again
        migrate.downgrade(db_url, "base")
        migrate.upgrade(db_url, "schema@head")
        apply_document(engine, pools("new-gpu"))

        # Then the worker's refresh sees another catalog
        fresh = refresh(engine, held)
        assert fresh.version == 1 and fresh is not held
        assert list(fresh.pools) == ["new-gpu"] and fresh.identity != held.identity
    finally:
        engine.dispose()


def test_a_restored_older_backup_that_counts_up_to_the_held_version_is_reloaded(engine):
    # Given a backup taken at version 1, and a worker holding version 2
    apply_document(engine, pools("a"))
    backup = snapshot(engine, ("pools", "catalog_version"))
    apply_document(engine, pools("a", "b"))
    held = load_routing(engine)
    assert held.version == 2

    # When the backup is restored and one other change brings it to version 2 again
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM pools"))
        conn.execute(pools_t.insert(), backup["pools"])
        conn.execute(
            sa.text("UPDATE catalog_version SET version = :v, identity = :i WHERE id = 1"),
            {"v": backup["catalog_version"][0]["version"], "i": backup["catalog_version"][0]["identity"]},
        )
    apply_document(engine, pools("a", "c"))

    # Then the worker reloads: same number, other contents
    fresh = refresh(engine, held)
    assert fresh.version == 2 and sorted(fresh.pools) == ["a", "c"]


def test_every_change_draws_a_new_identity(engine):
    identities = {load_routing(engine).identity}
    for width in (2, 3, 4):
        apply_document(engine, {"pools": [{"name": "p", "width": width, "ceiling": 8}]})
        identities.add(load_routing(engine).identity)
    assert len(identities) == 4 and all(len(identity) == 32 for identity in identities)


# --- 10: export always re-applies --------------------------------------------------


@pytest.mark.parametrize("fmt", ["toml", "yaml"])
def test_a_name_freed_by_a_rename_and_given_to_a_new_pool_exports_and_reapplies(engine, fmt):
    # Given gpu0 renamed in place to gpu0-dialog, then a new gpu0 (no prune)
    apply_document(engine, pools("gpu0"))
    gpu0_id = load_routing(engine).pools["gpu0"].id
    apply_document(engine, {"pools": [{"name": "gpu0-dialog", "width": 1, "previous_names": ["gpu0"]}]})
    apply_document(engine, pools("gpu0"))
    table = load_routing(engine)
    assert table.pools["gpu0-dialog"].id == gpu0_id and table.pools["gpu0"].id != gpu0_id
    before = snapshot(engine)

    # When its export is applied again
    changes = apply_document(engine, parse(dump(export_document(engine), fmt), fmt))

    # Then nothing changes
    assert changes.empty and snapshot(engine) == before


def test_the_fleet_with_a_new_pool_named_draw_exports_and_reapplies(db_url, engine):
    migrate.upgrade(db_url, "fleet@head")
    apply_document(engine, pools("draw"))
    before = snapshot(engine)

    changes = apply_document(engine, parse(dump(export_document(engine), "toml"), "toml"))

    assert changes.empty and snapshot(engine) == before


def test_two_pools_renaming_the_same_pool_are_refused(engine):
    from lanes.errors import CatalogInvalid

    apply_document(engine, pools("gpu0"))
    document = {"pools": [{"name": n, "width": 1, "previous_names": ["gpu0"]} for n in ("gpu0-a", "gpu0-b")]}

    with pytest.raises(CatalogInvalid, match=r"pools\[1\]\.previous_names: 'gpu0' is also renamed by pools\[0\]"):
        apply_document(engine, document, dry_run=True)


# --- 11: data revisions undo by id, and say what they overwrite ----------------------


def test_fleet_base_after_the_example_at_fleet_0002_removes_every_fleet_row(db_url, engine):
    # Given the old fleet, then the example applied over it (renaming five pools in place)
    migrate.upgrade(db_url, "fleet_0002")
    apply_document(engine, example())
    assert "aifarm-gpu0-dialog" in load_routing(engine).pools

    # When the fleet is taken out
    reports: list[str] = []
    migrate.downgrade(db_url, "fleet@base", progress=reports.append)

    # Then nothing of it stays, and it said which rows had been edited since
    table = load_routing(engine)
    assert (table.pools, table.models, table.workflows, table.services) == ({}, {}, {}, {})
    edited = [line for line in reports if "was edited after the upgrade" in line]
    assert len([line for line in edited if line.startswith("fleet_0001 downgrade: pools")]) == 5
    assert any("(aifarm-gpu0-dialog)" in line and "name 'dialog-gpu' -> 'aifarm-gpu0-dialog'" in line for line in edited)

    # and the fleet can be opted into again
    migrate.upgrade(db_url, "fleet@head")
    assert sorted(load_routing(engine).pools) == sorted(p["name"] for p in example()["pools"])


def test_a_downgrade_dry_run_lists_the_overwritten_edits_and_changes_nothing(isolated_env, db_url, monkeypatch):
    monkeypatch.setenv("LANES_DATABASE_URL", db_url)
    runner = CliRunner()
    assert runner.invoke(main, ["db", "upgrade", "fleet@head"]).exit_code == 0
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE pools SET width = 3 WHERE name = 'aifarm-gpu0-dialog'"))
            conn.execute(sa.text("UPDATE workflows SET reserve_ms = 5000 WHERE name = 'youtube'"))
        before = snapshot(engine)

        dry = runner.invoke(main, ["db", "downgrade", "fleet_0001", "--dry-run"])

        assert dry.exit_code == 0, dry.output
        assert snapshot(engine) == before
        assert migrate.branch_states(engine)[1].revision == "fleet_0004"
        lines = dry.output.splitlines()
        assert "dry run: Running downgrade fleet_0003 -> fleet_0002" in dry.output
        dialog = [line for line in lines if line.startswith("dry run: fleet_0003 downgrade: pools id")
                  and "(aifarm-gpu0-dialog)" in line]
        assert len(dialog) == 1 and "width 4 -> 3" in dialog[0], lines
        assert any("fleet_0002 downgrade: workflows" in line and "reserve_ms 10000 -> 5000" in line for line in lines)
        assert lines[-1] == "dry run: nothing was changed"

        # The real downgrade says the same, then does it
        real = runner.invoke(main, ["db", "downgrade", "fleet_0001"])
        assert real.exit_code == 0 and "(aifarm-gpu0-dialog) was edited after the upgrade" in real.output
        assert migrate.branch_states(engine)[1].revision == "fleet_0001"
    finally:
        engine.dispose()


# --- 12: relative revisions and a linear re-apply -------------------------------------


def test_db_downgrade_minus_one_is_a_revision_not_an_option(isolated_env, db_url, monkeypatch):
    monkeypatch.setenv("LANES_DATABASE_URL", db_url)
    runner = CliRunner()
    assert runner.invoke(main, ["db", "upgrade"]).exit_code == 0

    one_step = runner.invoke(main, ["db", "downgrade", "-1"])

    assert one_step.exit_code == 0, one_step.output
    assert "schema: catalog_0004" in one_step.output
    assert runner.invoke(main, ["db", "upgrade", "+1"]).exit_code == 0
    assert runner.invoke(main, ["db", "upgrade", "fleet@head"]).exit_code == 0
    ambiguous = runner.invoke(main, ["db", "downgrade", "-1"])
    assert ambiguous.exit_code == 2 and "ambiguous" in ambiguous.output and "fleet@-1" in ambiguous.output


def _lines_run_in_apply(engine, document) -> int:
    """How many lines of lanes/catalog/apply.py a no-op apply runs (a count, not a time)."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if frame.f_code.co_filename.endswith("lanes/catalog/apply.py"):
            if event == "line":
                count += 1
            return tracer
        return None

    sys.settrace(tracer)
    try:
        assert apply_document(engine, document).empty
    finally:
        sys.settrace(None)
    return count


def test_a_no_op_reapply_grows_linearly_with_the_pools(sqlite_url):
    engine = make_engine(sqlite_url)
    try:
        migrate.ensure_schema(engine)
        small = {"pools": [{"name": f"p{n}", "width": 1, "previous_names": [f"old{n}"]} for n in range(400)]}
        large = {"pools": [{"name": f"p{n}", "width": 1, "previous_names": [f"old{n}"]} for n in range(1600)]}
        apply_document(engine, large)
        engine_small = make_engine(sqlite_url.replace("catalog.db", "small.db"))
        migrate.ensure_schema(engine_small)
        apply_document(engine_small, small)

        ratio = _lines_run_in_apply(engine, large) / _lines_run_in_apply(engine_small, small)
        engine_small.dispose()
    finally:
        engine.dispose()

    # Four times the pools: about four times the work (quadratic would be sixteen)
    assert ratio < 6, ratio


def test_db_upgrade_of_a_fleet_revision_brings_the_schema_to_head_first(isolated_env, db_url, monkeypatch):
    monkeypatch.setenv("LANES_DATABASE_URL", db_url)
    runner = CliRunner()
    runner.invoke(main, ["db", "upgrade", "fleet@head"])
    current = json.loads(runner.invoke(main, ["db", "current", "--json"]).stdout)
    assert [(b["branch"], b["revision"]) for b in current["branches"]] == [
        ("schema", "catalog_0005"),
        ("fleet", "fleet_0004"),
        ("memory", None),
    ]


def test_a_failed_fleet_downgrade_changes_nothing_of_its_step_and_can_be_retried(db_url, engine):
    from lanes.errors import LanesError

    # Given the fleet, and an operator's model of their own in one of its pools
    migrate.upgrade(db_url, "schema@head")
    migrate.upgrade(db_url, "fleet_0001")
    with engine.begin() as conn:
        pool_id = conn.execute(sa.text("SELECT id FROM pools WHERE name = 'draw'")).scalar_one()
        conn.execute(
            sa.text(
                "INSERT INTO models (name, base_url, kind, pool_id, timeout_ms)"
                " VALUES ('mine', 'http://x/v1', 'chat', :p, 1000)"
            ),
            {"p": pool_id},
        )
    before = snapshot(engine)

    # When the fleet is taken out, its pool cannot go (the model refers to it)
    # (PostgreSQL's foreign key refuses the statement; SQLite's check refuses the migration)
    with pytest.raises(LanesError, match=r"refused the operation|the migration was refused.*models row"):
        migrate.downgrade(db_url, "fleet@base")

    # Then nothing of the step changed, its record of ids included, and it works once the model is gone
    assert snapshot(engine) == before and migrate.branch_states(engine)[1].revision == "fleet_0001"
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM models WHERE name = 'mine'"))
    migrate.downgrade(db_url, "fleet@base")
    assert load_routing(engine).pools == {}

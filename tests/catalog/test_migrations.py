"""Alembic revisions on SQLite and PostgreSQL: up, down, and data round trips."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlmodel import SQLModel

from lanes.catalog import make_engine, migrate, open_catalog
from lanes.catalog.version import catalog_version
from tests.catalog.conftest import snapshot

DATA_REVISIONS = [("fleet_0001", "fleet@base"), ("fleet_0002", "fleet_0001"), ("fleet_0003", "fleet_0002"),
                  ("fleet_0004", "fleet_0003")]
LEGACY_CONTROLLER = """UPDATE pools SET controller_kind = 'vllm_gauges',
    controller_params = '{"target_waiting": 2, "interval_seconds": 10.0}' WHERE name = 'aifarm-embedder'"""


def test_upgrading_to_heads_then_downgrading_to_base_leaves_only_alembics_table(db_url):
    migrate.upgrade(db_url, "heads")
    engine = make_engine(db_url)
    try:
        assert "pools" in migrate.table_names(engine)
        migrate.downgrade(db_url, "base")
        assert migrate.table_names(engine) == ["alembic_version"]
    finally:
        engine.dispose()


def test_each_data_revision_down_after_up_restores_every_row_and_id(db_url):
    engine = make_engine(db_url)
    try:
        migrate.upgrade(db_url, "schema@head")
        # An operator's own rows exist before the fleet, so ids are not trivially 1..n.
        from lanes.catalog import apply_document

        apply_document(engine, _lab_document())
        for revision, below in DATA_REVISIONS:
            if revision == "fleet_0003":
                # A change made after the fleet landed must survive up then down.
                with engine.begin() as conn:
                    conn.execute(sa.text("UPDATE pools SET width = 3, ceiling = 5 WHERE name = 'asr'"))
            if revision == "fleet_0004":
                # A row written under the old controller kinds is what it converts.
                with engine.begin() as conn:
                    conn.execute(sa.text(LEGACY_CONTROLLER))
            before = snapshot(engine)
            migrate.upgrade(db_url, revision)
            assert snapshot(engine) != before, f"{revision} changed nothing"
            migrate.downgrade(db_url, below)
            assert snapshot(engine) == before, f"down({revision}) did not restore the rows"
            migrate.upgrade(db_url, revision)
    finally:
        engine.dispose()


def test_the_lane_pools_revision_renames_in_place_and_merges_gpu1(db_url):
    migrate.upgrade(db_url, "schema@head")
    migrate.upgrade(db_url, "fleet_0002")
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            old = dict(conn.execute(sa.text("SELECT name, id FROM pools")).all())
        version = catalog_version(engine)
        migrate.upgrade(db_url, "fleet@head")
        assert catalog_version(engine) == version + 1
        with engine.connect() as conn:
            rows = {r.name: r for r in conn.execute(sa.text("SELECT * FROM pools")).all()}
            media_models = conn.execute(
                sa.text(
                    "SELECT m.name FROM models m JOIN pools p ON p.id = m.pool_id"
                    " WHERE p.name = 'aifarm-gpu1-media'"
                )
            ).scalars()
            media = sorted(media_models)
        assert rows["aifarm-gpu0-dialog"].id == old["dialog-gpu"]
        assert rows["aifarm-embedder"].width == 8 and rows["aifarm-gpu1-privacy"].width == 4
        assert rows["aifarm-gpu1-media"].id == old["draw"] and rows["aifarm-gpu1-media"].width == 1
        assert set(rows) == {
            "aifarm-gpu0-dialog", "aifarm-gpu2-utility", "aifarm-gpu1-media", "aifarm-embedder", "aifarm-gpu1-privacy"
        }
        assert media == ["draw-xl", "music-gen", "whisper-large"]
    finally:
        engine.dispose()


def test_the_models_and_the_migrations_describe_the_same_tables(db_url):
    migrate.upgrade(db_url, "schema@head")
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, SQLModel.metadata) == []
    finally:
        engine.dispose()


def test_open_catalog_creates_the_sqlite_file_under_the_state_dir_and_skips_the_fleet(make_settings):
    settings = make_settings()
    engine = open_catalog(settings)
    try:
        assert settings.sqlite_path.exists()
        assert [(s.branch, s.revision) for s in migrate.branch_states(engine)] == [
            ("schema", "catalog_0005"),
            ("fleet", None),
            ("memory", None),
        ]
        assert catalog_version(engine) == 0
    finally:
        engine.dispose()
    # A second open is a no-op, and keeps an opted-in branch where it is.
    migrate.upgrade(settings.catalog_url(), "fleet_0001")
    open_catalog(settings).dispose()
    engine = make_engine(settings.catalog_url())
    try:
        assert migrate.default_targets(engine) == ["schema@head", "fleet@head"]
    finally:
        engine.dispose()


def _lab_document() -> dict:
    return {
        "pools": [{"name": "lab-gpu", "width": 2}],
        "models": [{"name": "lab-7b", "base_url": "http://lab:8000/v1", "pool": "lab-gpu", "service": "lab"}],
        "workflows": [{"name": "lab", "candidates": ["lab-7b"]}],
        "services": [{"name": "lab", "limit": 2}],
    }


def test_plain_alembic_from_the_repository_root(tmp_path):
    root = Path(__file__).resolve().parents[2]
    url = f"sqlite:///{tmp_path / 'plain.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANES_")}

    def alembic(*args):
        return subprocess.run(
            [sys.executable, "-m", "alembic", *args], cwd=root, env=env, capture_output=True, text=True, timeout=60
        )

    assert alembic("-x", f"url={url}", "upgrade", "fleet@head").returncode == 0
    current = alembic("-x", f"url={url}", "current")
    assert current.returncode == 0 and "fleet_0004" in current.stdout


def test_the_controllers_revision_converts_legacy_rows_to_the_new_kinds(db_url):
    for target in migrate.upgrade_targets("fleet_0003"):  # the schema at head, as `lanes db upgrade` does
        migrate.upgrade(db_url, target)
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(LEGACY_CONTROLLER))
        migrate.upgrade(db_url, "fleet_0004")
        from lanes.catalog import load_routing

        pool = load_routing(engine).pools["aifarm-embedder"]
        assert list(pool.controllers) == ["vllm"]
        assert pool.controllers["vllm"]["waiting_threshold"] == 2
        assert pool.controllers["vllm"]["interval_seconds"] == 10.0
        assert pool.controllers["vllm"]["scrape_seconds"] == 12.0
    finally:
        engine.dispose()


def test_catalogs_opened_from_many_threads_at_once_all_reach_head(make_settings):
    settings = make_settings()
    errors = []

    def open_one():
        try:
            open_catalog(settings).dispose()
        except Exception as exc:  # noqa: BLE001  (collected and asserted below)
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


@pytest.mark.slow  # processes racing: the slow tier
def test_processes_creating_one_catalog_at_once_all_succeed(db_url, tmp_path):
    code = (
        "import sys; from lanes.catalog import open_catalog, catalog_version; from lanes.settings import Settings; "
        "print(catalog_version(open_catalog(Settings(database_url=sys.argv[1], state_dir=sys.argv[2]))))"
    )
    processes = [
        subprocess.Popen([sys.executable, "-c", code, db_url, str(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    results = [process.communicate(timeout=60) for process in processes]
    assert [process.returncode for process in processes] == [0] * 4, [err for _, err in results]
    assert [out.strip() for out, _ in results] == ["0"] * 4

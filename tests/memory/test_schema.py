"""The memory branch: its revision matches lanes/memory/tables.py, and goes up and down."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from lanes.catalog import make_engine, migrate
from lanes.memory import ensure_memory_schema
from lanes.memory.tables import MEMORY_TABLES, metadata


def test_the_memory_revision_and_the_tables_module_describe_the_same_tables(db_url):
    engine = make_engine(db_url)
    try:
        ensure_memory_schema(engine)
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True, "include_name": _memory_only})
            diff = compare_metadata(context, metadata)
        assert diff == []
    finally:
        engine.dispose()


def test_the_memory_branch_goes_up_with_its_dependency_and_down_alone(db_url):
    engine = make_engine(db_url)
    try:
        ensure_memory_schema(engine)  # brings catalog_0001 along
        tables = set(migrate.table_names(engine))
        assert set(MEMORY_TABLES) <= tables and "pools" in tables
        assert migrate.default_targets(engine) == ["schema@head", "memory@head"]
        migrate.downgrade(db_url, "memory@base")
        left = set(migrate.table_names(engine))
        assert not set(MEMORY_TABLES) & left and "pools" in left
        ensure_memory_schema(engine)
        assert set(MEMORY_TABLES) <= set(migrate.table_names(engine))
    finally:
        engine.dispose()


def _memory_only(name, type_, parent_names) -> bool:
    table = name if type_ == "table" else parent_names.get("table_name")
    return table is None or table in MEMORY_TABLES


def test_memory_0002_folds_repeated_imports_going_up_and_keeps_every_row_going_down(db_url):
    import sqlalchemy as sa

    engine = make_engine(db_url)
    try:
        ensure_memory_schema(engine)
        migrate.downgrade(db_url, "memory_0001")
        at = "2026-05-10 09:15:00"
        with engine.begin() as conn:
            for text in ("hello", "hello", "again"):  # the same file imported twice stored "hello" twice
                conn.execute(sa.text("INSERT INTO chat_messages (chat_id, at, hour, role, text) "
                                     "VALUES ('a', :at, '2026-05-10 09:00:00', 'user', :text)"), {"at": at, "text": text})
            conn.execute(sa.text("INSERT INTO memory_runs (chat_id, hour, status, attempts, created_at, updated_at) "
                                 "VALUES ('a', '2026-05-10 09:00:00', 'running', 1, :at, :at)"), {"at": at})
        ensure_memory_schema(engine)
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT text, digest FROM chat_messages ORDER BY id")).all()
            run = conn.execute(sa.text("SELECT status, claim, lease_until, sent_epoch, rerun FROM memory_runs")).one()
        assert [r.text for r in rows] == ["hello", "again"] and all(len(r.digest) == 64 for r in rows)
        assert (run.status, run.claim, run.lease_until, run.sent_epoch, bool(run.rerun)) == (
            "running", None, None, None, False)
        migrate.downgrade(db_url, "memory_0001")
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM chat_messages")).scalar_one() == 2
            assert conn.execute(sa.text("SELECT status FROM memory_runs")).scalar_one() == "running"
    finally:
        engine.dispose()

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

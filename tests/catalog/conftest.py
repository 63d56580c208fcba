"""Catalog fixtures: an engine at schema head on each database, the example file."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from lanes.catalog import make_engine
from lanes.catalog.migrate import ensure_schema

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "aifarm.toml"
# Tables whose rows are the catalog's state (the version and events are not).
STATE_TABLES = ("pools", "models", "workflows", "workflow_candidates", "services", "revision_backups")


@pytest.fixture
def engine(db_url):
    """A catalog at schema head on SQLite and on PostgreSQL."""
    engine = make_engine(db_url)
    ensure_schema(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def example_path() -> Path:
    return EXAMPLE


def snapshot(engine, tables=STATE_TABLES) -> dict[str, list[dict]]:
    """Every row of ``tables``, ids included, in primary-key order."""
    result = {}
    with engine.connect() as conn:
        for name in tables:
            table = sa.Table(name, sa.MetaData(), autoload_with=conn)
            order = list(table.primary_key.columns)
            result[name] = [dict(row) for row in conn.execute(sa.select(table).order_by(*order)).mappings()]
    return result

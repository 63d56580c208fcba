"""The two dialect-specific statements the memory tables need, for SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
from typing import Iterator

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from lanes.catalog.engine import database_errors, is_sqlite, writing


def _insert(conn: Connection, table: sa.Table):
    return (sqlite.insert if is_sqlite(conn) else postgresql.insert)(table)


def insert_many_or_skip(conn: Connection, table: sa.Table, rows: list[dict], unique: list[str],
                        returning: list[sa.Column]) -> list:
    """Insert the rows whose unique key does not exist yet; the ``returning``
    values of the rows inserted (not of those skipped), in no set order.

    One statement executed for many parameter sets: SQLAlchemy batches it
    into multi-row INSERTs ("insertmanyvalues") compiled once.
    """
    if not rows:
        return []
    statement = _insert(conn, table).on_conflict_do_nothing(index_elements=unique).returning(*returning)
    return list(conn.execute(statement, rows).all())


def upsert(conn: Connection, table: sa.Table, values: dict, key: list[str], updates: dict) -> None:
    """Insert a row, or apply ``updates`` (column -> expression over ``excluded``) to the existing one."""
    statement = _insert(conn, table).values(**values)
    statement = statement.on_conflict_do_update(
        index_elements=key, set_={name: make(statement.excluded) for name, make in updates.items()}
    )
    conn.execute(statement)


@contextlib.contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction that holds SQLite's write lock from its first statement.

    A deferred SQLite transaction that reads and then writes can fail at the
    write when another writer got there first; taking the lock up front makes
    the second writer wait (busy timeout) instead. The catalog's
    :func:`~lanes.catalog.engine.writing` does exactly that (``BEGIN IMMEDIATE``);
    PostgreSQL callers lock the rows they need with FOR UPDATE.
    """
    with database_errors(engine), writing(engine) as conn:
        yield conn

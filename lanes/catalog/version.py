"""The catalog version: one number that grows with every catalog change.

Running processes poll :func:`catalog_version` (one primary-key read) and
reload their routing table when it moves; ``apply`` and the data revisions
bump it in the same transaction as their change, so a process that sees the
new number also sees the new rows. Events are not catalog changes and do not
bump it.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from lanes.catalog.engine import database_errors
from lanes.catalog.state import read_version, version_t
from lanes.catalog.tables import utcnow


def catalog_version(engine: Engine) -> int:
    with database_errors(engine), engine.connect() as conn:
        return read_version(conn)


def lock_version(conn: Connection) -> int:
    """Read the version, holding its row until the transaction ends.

    Two writers of the catalog then run one after the other on PostgreSQL.
    SQLite has one writer at a time anyway (FOR UPDATE is ignored there).
    """
    query = sa.select(version_t.c.version).where(version_t.c.id == 1).with_for_update()
    return int(conn.execute(query).scalar_one())


def bump_version(conn: Connection | Engine) -> int:
    """Add one to the version inside the caller's transaction (or, given an
    engine, in a transaction of its own); return the new value."""
    if isinstance(conn, Engine):
        with database_errors(conn), conn.begin() as connection:
            return bump_version(connection)
    conn.execute(
        version_t.update().where(version_t.c.id == 1).values(version=version_t.c.version + 1, changed_at=utcnow())
    )
    return read_version(conn)

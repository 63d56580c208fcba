"""The catalog version: one number that grows with every catalog change, and
a random identity drawn anew with it.

Running processes poll :func:`catalog_stamp` (one primary-key read) and
reload their routing table when it moves; ``apply`` and the data revisions
bump it in the same transaction as their change, so a process that sees the
new stamp also sees the new rows. Events are not catalog changes and do not
bump it.

The number alone is not enough to tell two catalogs apart: after ``lanes db
downgrade base`` and ``upgrade`` (or restoring an older backup) the count
starts again from an old value with other rows behind it. The identity is
random and replaced with every bump, so two different contents never share a
stamp, and comparing stamps (never versions alone) is what decides a reload.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from lanes.catalog.engine import database_errors, writing
from lanes.catalog.state import read_stamp, read_version, version_t
from lanes.catalog.tables import utcnow


@dataclass(frozen=True)
class CatalogStamp:
    """Which catalog contents a process holds: equal stamps, equal contents."""

    identity: str
    version: int


def catalog_version(engine: Engine) -> int:
    """The version number people read (``catalog show``); compare stamps, not this."""
    return catalog_stamp(engine).version


def catalog_stamp(engine: Engine) -> CatalogStamp:
    with database_errors(engine), engine.connect() as conn:
        identity, version = read_stamp(conn)
        return CatalogStamp(identity, version)


def lock_version(conn: Connection) -> int:
    """Read the version, holding its row until the transaction ends.

    Two writers of the catalog then run one after the other on PostgreSQL.
    On SQLite the writer's transaction (``writing``) already holds the
    database's write lock from its BEGIN IMMEDIATE; FOR UPDATE is ignored there.
    """
    query = sa.select(version_t.c.version).where(version_t.c.id == 1).with_for_update()
    return int(conn.execute(query).scalar_one())


def bump_version(conn: Connection | Engine) -> int:
    """Add one to the version and draw a new identity inside the caller's
    transaction (or, given an engine, in a write transaction of its own);
    return the new version."""
    if isinstance(conn, Engine):
        with database_errors(conn), writing(conn) as connection:
            return bump_version(connection)
    conn.execute(
        version_t.update()
        .where(version_t.c.id == 1)
        .values(version=version_t.c.version + 1, identity=uuid.uuid4().hex, changed_at=utcnow())
    )
    return read_version(conn)

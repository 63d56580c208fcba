"""Bringing a catalog database's memory tables to their head.

The memory branch is separate from the schema branch so that a catalog used
only for routing carries no history tables; everything that reads or writes
history calls :func:`open_memory` (or :func:`ensure_memory_schema`) first.
"""

from __future__ import annotations

from alembic import command
from sqlalchemy.engine import Engine

from lanes.catalog import open_catalog
from lanes.catalog import migrate
from lanes.catalog.engine import database_errors
from lanes.settings import Settings

MEMORY_HEAD = "memory@head"


def ensure_memory_schema(engine: Engine) -> None:
    """Create or upgrade the memory tables; one query when already at head."""
    script = migrate.script_directory()
    head = script.get_revision(MEMORY_HEAD).revision
    if head in migrate.applied_revisions(script, migrate.current_heads(engine)):
        return
    # Alembic keeps its context in module globals: one migration per process
    # at a time (the catalog's own lock). Another process doing the same
    # waits on the lock migrations/env.py takes and then finds nothing to do.
    with migrate._MIGRATING:
        if head in migrate.applied_revisions(script, migrate.current_heads(engine)):
            return
        with database_errors(engine):
            with engine.begin() as conn, migrate.alembic_config(connection=conn) as config:
                command.upgrade(config, MEMORY_HEAD)


def open_memory(settings: Settings, *, create: bool = True) -> Engine:
    """The catalog engine of ``settings`` with both the schema and the memory tables at head.

    ``create=False`` (commands that read runs) refuses a catalog that does not
    exist yet, as :func:`lanes.catalog.open_catalog` does, instead of making an
    empty one at a mistyped SQLite path.
    """
    engine = open_catalog(settings, create=create)
    try:
        ensure_memory_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine

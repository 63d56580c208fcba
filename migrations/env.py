"""Alembic environment for the Lanes catalog.

Where the database comes from, first match wins:
1. ``config.attributes["connection"]``: an open connection (``open_catalog``);
2. ``config.attributes["url"]``: a URL (``lanes db``), kept out of the ini file
   so a password is never interpolated or logged;
3. ``alembic -x url=...``;
4. the Lanes settings: ``LANES_DATABASE_URL`` or the SQLite file in the state dir.

One migrator at a time: PostgreSQL takes an advisory lock, SQLite its write
lock (BEGIN IMMEDIATE), both before alembic reads the version table.

SQLite cannot ALTER most things, so every context renders batch operations
(``render_as_batch``), which rebuild the table on SQLite and ALTER elsewhere.
The rebuild drops the old table, so foreign keys are off while migrating
(their ON DELETE CASCADE would otherwise empty ``workflow_candidates``) and
checked after each step, before it commits (``lanes.catalog.engine.migrating``).
"""

from __future__ import annotations

import logging.config

from alembic import context
from sqlmodel import SQLModel

import lanes.catalog.tables  # noqa: F401  (registers the tables on SQLModel.metadata)
from lanes.catalog.engine import SQLITE_BEGIN_OPTION, check_foreign_keys, make_engine, sqlite_foreign_keys_off

config = context.config
target_metadata = SQLModel.metadata

# PostgreSQL: one migrator at a time per database (an arbitrary fixed key).
ADVISORY_LOCK_KEY = 0x1A4E5


def _configure_logging() -> None:
    if config.config_file_name and config.attributes.get("configure_logging", True):
        parser = config.file_config
        if parser.has_section("loggers"):
            logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    url = config.attributes.get("url") or context.get_x_argument(as_dictionary=True).get("url")
    if url:
        return url
    from lanes.settings import load_settings

    return load_settings().catalog_url()


def _run(connection) -> None:
    if connection.dialect.name == "sqlite" and not connection.in_transaction():
        # Take SQLite's write lock before alembic reads the version table, so a
        # second process creating the same catalog waits (busy timeout) and
        # then finds nothing to do. It also makes SQLite's DDL transactional.
        # (The engine's begin hook sends BEGIN IMMEDIATE; see lanes.catalog.engine.)
        connection.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
        # After each step, before alembic commits it (SQLite commits step by step).
        on_version_apply=(lambda ctx, **_: check_foreign_keys(ctx.connection),),
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Taken before alembic reads the version table, so a second process
            # starting at the same moment sees the first one's result.
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({ADVISORY_LOCK_KEY})")
        context.run_migrations()


def run_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as connection, sqlite_foreign_keys_off(connection):
            _run(connection)
            connection.commit()
    finally:
        engine.dispose()


_configure_logging()
if context.is_offline_mode():
    run_offline()
else:
    run_online()

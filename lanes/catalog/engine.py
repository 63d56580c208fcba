"""Engines for the catalog database, its transactions, and the translation of driver errors.

SQLite (the embedded default) gets foreign keys switched on and a busy timeout,
so that two local processes writing at once wait instead of failing. PostgreSQL
connects with a bounded timeout and pings pooled connections, so a restarted
server costs one retry rather than an error.

Transactions are explicit on SQLite too. pysqlite on its own sends no ``BEGIN``
before a ``SELECT`` (each read is its own snapshot) and a deferred ``BEGIN``
before the first write, so a writer could plan from rows another process
changes before its writes land. Here (SQLAlchemy's pysqlite recipe) the driver's
own transaction handling is switched off and every transaction starts with
``BEGIN``: a reader's statements then share one snapshot (SQLite keeps its
shared lock until the end). Writers go through :func:`writing`, which starts with
``BEGIN IMMEDIATE``: the write lock is taken before the first read, so two
writers run one after the other, each planning from the other's result. On
PostgreSQL :func:`reading` asks for REPEATABLE READ and writers lock the
version row (``SELECT ... FOR UPDATE``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, make_url

from lanes.errors import DatabaseUnavailable, InvalidInput, LanesError
from lanes.settings import mask_url

CONNECT_TIMEOUT_SECONDS = 5
# Execution option naming the SQLite BEGIN mode ("IMMEDIATE" for writers).
SQLITE_BEGIN_OPTION = "lanes_sqlite_begin"
SQLITE_BUSY_SECONDS = 30


def make_engine(url: str) -> Engine:
    """An engine for ``url``; creates the directory of a SQLite file."""
    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError:
        raise InvalidInput(
            f"bad database URL {mask_url(url)!r} (want sqlite:///PATH or postgresql+psycopg://USER@HOST/DB)"
        ) from None
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        if database and database != ":memory:" and not database.startswith("file:"):
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_SECONDS})
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        sa.event.listen(engine, "begin", _sqlite_begin)
        return engine
    connect_args = {"connect_timeout": CONNECT_TIMEOUT_SECONDS} if parsed.get_backend_name() == "postgresql" else {}
    return sa.create_engine(parsed, pool_pre_ping=True, connect_args=connect_args)


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    # SQLite ignores REFERENCES clauses unless asked, per connection.
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
    # The driver's implicit BEGINs are off; _sqlite_begin sends our own.
    dbapi_connection.isolation_level = None


def _sqlite_begin(conn: Connection) -> None:
    if conn.connection.dbapi_connection.in_transaction:
        return  # a caller (alembic's env) already began with its own statement
    mode = conn.get_execution_options().get(SQLITE_BEGIN_OPTION, "")
    conn.exec_driver_sql(f"BEGIN {mode}".strip())


@contextlib.contextmanager
def writing(engine: Engine) -> Iterator[Connection]:
    """A write transaction: one writer of the catalog at a time, from its first read.

    SQLite: ``BEGIN IMMEDIATE`` (the write lock, waiting up to the busy
    timeout for another writer). Callers on PostgreSQL lock the version row
    (:func:`lanes.catalog.version.lock_version`) before reading what they plan from.
    """
    with engine.connect() as conn:
        conn.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
        with conn.begin():
            yield conn


@contextlib.contextmanager
def reading(engine: Engine) -> Iterator[Connection]:
    """A read transaction whose statements all see one committed state of the catalog."""
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            yield conn


@contextlib.contextmanager
def migrating(engine: Engine) -> Iterator[Connection]:
    """A write transaction for schema changes.

    On SQLite, with foreign keys off for its length: SQLite cannot ALTER most
    things, so a revision rebuilds a table (copy, DROP, rename), and a DROP
    with foreign keys on runs their ON DELETE actions: dropping ``workflows``
    would delete every workflow's candidates. SQLite honours the switch only
    outside a transaction, so it is set before BEGIN and restored after;
    :func:`check_foreign_keys` then proves the rebuilt tables still agree.
    """
    with engine.connect() as conn:
        with sqlite_foreign_keys_off(conn):
            conn.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            with conn.begin():
                yield conn


@contextlib.contextmanager
def sqlite_foreign_keys_off(conn: Connection) -> Iterator[None]:
    """Foreign keys off on a SQLite connection not yet in a transaction (else nothing)."""
    raw = conn.connection.dbapi_connection if is_sqlite(conn) else None
    if raw is None or raw.in_transaction:
        yield
        return
    raw.execute("PRAGMA foreign_keys=OFF")
    try:
        yield
    finally:
        raw.execute("PRAGMA foreign_keys=ON")


def check_foreign_keys(conn: Connection) -> None:
    """Refuse (roll back) a SQLite migration that left a row pointing nowhere."""
    if not is_sqlite(conn):
        return
    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    if broken:
        table, rowid, parent, _ = broken[0]
        raise LanesError(
            f"the migration was refused: it would leave {len(broken)} row(s) referring to rows that are gone "
            f"(first: {table} row {rowid} refers to a missing {parent} row); nothing was changed"
        )


def is_sqlite(engine_or_connection) -> bool:
    return engine_or_connection.dialect.name == "sqlite"


@contextlib.contextmanager
def database_errors(url: object) -> Iterator[None]:
    """Turn driver exceptions into one-line Lanes errors naming the (masked) URL."""
    try:
        yield
    except sa.exc.OperationalError as exc:
        raise DatabaseUnavailable(f"catalog database {_show(url)} did not answer: {first_line(exc)}") from None
    except sa.exc.InterfaceError as exc:
        raise DatabaseUnavailable(f"catalog database {_show(url)} did not answer: {first_line(exc)}") from None
    except sa.exc.SQLAlchemyError as exc:
        raise LanesError(f"catalog database {_show(url)} refused the operation: {first_line(exc)}") from None


def _show(url: object) -> str:
    if isinstance(url, Engine):
        return url.url.render_as_string(hide_password=True)
    return str(mask_url(str(url)))


def first_line(exc: BaseException) -> str:
    inner = getattr(exc, "orig", None) or exc
    text = str(inner).strip().splitlines()
    return text[0] if text else type(inner).__name__

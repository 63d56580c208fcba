"""Engines for the catalog database, and the translation of driver errors.

SQLite (the embedded default) gets foreign keys switched on and a busy timeout,
so that two local processes writing at once wait instead of failing. PostgreSQL
connects with a bounded timeout and pings pooled connections, so a restarted
server costs one retry rather than an error.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from lanes.errors import DatabaseUnavailable, InvalidInput, LanesError
from lanes.settings import mask_url

CONNECT_TIMEOUT_SECONDS = 5
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
        return engine
    connect_args = {"connect_timeout": CONNECT_TIMEOUT_SECONDS} if parsed.get_backend_name() == "postgresql" else {}
    return sa.create_engine(parsed, pool_pre_ping=True, connect_args=connect_args)


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    # SQLite ignores REFERENCES clauses unless asked, per connection.
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def is_sqlite(engine_or_connection) -> bool:
    return engine_or_connection.dialect.name == "sqlite"


@contextlib.contextmanager
def database_errors(url: object) -> Iterator[None]:
    """Turn driver exceptions into one-line Lanes errors naming the (masked) URL."""
    try:
        yield
    except sa.exc.OperationalError as exc:
        raise DatabaseUnavailable(f"catalog database {_show(url)} did not answer: {_first_line(exc)}") from None
    except sa.exc.InterfaceError as exc:
        raise DatabaseUnavailable(f"catalog database {_show(url)} did not answer: {_first_line(exc)}") from None
    except sa.exc.SQLAlchemyError as exc:
        raise LanesError(f"catalog database {_show(url)} refused the operation: {_first_line(exc)}") from None


def _show(url: object) -> str:
    if isinstance(url, Engine):
        return url.url.render_as_string(hide_password=True)
    return str(mask_url(str(url)))


def _first_line(exc: BaseException) -> str:
    inner = getattr(exc, "orig", None) or exc
    text = str(inner).strip().splitlines()
    return text[0] if text else type(inner).__name__

"""Alembic, driven from Lanes: the shipped ``migrations`` package, found with
importlib.resources so an installed wheel migrates without the repository.

Branches (see docs/CATALOG.md):
- ``schema``: the tables. ``open_catalog`` and ``lanes db upgrade`` go to its head.
- ``fleet``: opt-in data revisions holding the reference fleet.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.resources
import logging
import re
import threading
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Iterator

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.engine import Engine, make_url

from lanes.catalog.engine import database_errors, make_engine, migrating
from lanes.errors import InvalidInput
from lanes.settings import mask_url

SCHEMA_HEAD = "schema@head"
# Data revisions report edits their downgrade overwrites here (migrations/helpers.py).
LATER_EDITS_LOGGER = "lanes.migrations"
_MIGRATING = threading.Lock()


@contextlib.contextmanager
def alembic_config(*, url: str | None = None, connection=None) -> Iterator[Config]:
    """A Config for the shipped migrations; the URL travels as an attribute, not in the ini."""
    ini = importlib.resources.files("migrations").joinpath("alembic.ini")
    with importlib.resources.as_file(ini) as path:
        config = Config(str(path))
        config.attributes["configure_logging"] = False
        if url is not None:
            config.attributes["url"] = url
        if connection is not None:
            config.attributes["connection"] = connection
        yield config


@functools.lru_cache(maxsize=1)
def script_directory() -> ScriptDirectory:
    """The shipped revisions (read once per process: they cannot change under it)."""
    with alembic_config() as config:
        return ScriptDirectory.from_config(config)


@dataclass(frozen=True)
class Revision:
    revision: str
    branches: tuple[str, ...]
    doc: str
    is_head: bool


@dataclass(frozen=True)
class BranchState:
    """Where one branch stands in a database: its newest applied revision, if any."""

    branch: str
    revision: str | None
    head: str

    @property
    def at_head(self) -> bool:
        return self.revision == self.head


def current_heads(engine: Engine) -> tuple[str, ...]:
    with database_errors(engine), engine.connect() as conn:
        return tuple(MigrationContext.configure(conn).get_current_heads())


def applied_revisions(script: ScriptDirectory, heads: tuple[str, ...]) -> list[str]:
    """Every revision applied under ``heads``, dependencies included, newest first."""
    return [rev.revision for rev in script.iterate_revisions(heads, "base")] if heads else []


def branch_states(engine: Engine) -> list[BranchState]:
    script = script_directory()
    applied = applied_revisions(script, current_heads(engine))
    states = []
    for head in sorted(script.get_heads()):
        branch = sorted(script.get_revision(head).branch_labels)[0]
        in_branch = [rev for rev in applied if branch in script.get_revision(rev).branch_labels]
        states.append(BranchState(branch, in_branch[0] if in_branch else None, head))
    return sorted(states, key=lambda state: (state.branch != "schema", state.branch))


def all_revisions() -> list[Revision]:
    script = script_directory()
    heads = set(script.get_heads())
    return [_describe(script, rev.revision, heads) for rev in reversed(list(script.walk_revisions()))]


def _describe(script: ScriptDirectory, rev: str, heads: set[str]) -> Revision:
    found = script.get_revision(rev)
    doc = (found.doc or "").strip().splitlines()[0] if found.doc else ""
    return Revision(rev, tuple(sorted(found.branch_labels)), doc, rev in heads)


def default_targets(engine: Engine) -> list[str]:
    """What ``lanes db upgrade`` with no revision means: the schema's head, and
    the head of every opt-in branch the database has already entered."""
    targets = [SCHEMA_HEAD]
    for state in branch_states(engine):
        if state.branch != "schema" and state.revision is not None:
            targets.append(f"{state.branch}@head")
    return targets


def upgrade_targets(revision: str) -> list[str]:
    """What ``lanes db upgrade REVISION`` runs: the schema's head first, unless
    REVISION is a schema revision itself (or relative, or every head). A fleet
    revision depends only on the first schema revision, and every command needs
    the schema at head anyway."""
    if revision == "heads" or revision.startswith(("schema@", "+", "-")):
        return [revision]
    try:
        found = script_directory().get_revision(revision)
    except Exception:  # noqa: BLE001  (alembic raises several kinds; upgrade() then says what is wrong)
        return [revision]
    if found is None or "schema" in found.branch_labels:
        return [revision]
    return [SCHEMA_HEAD, revision]


def upgrade(url: str, revision: str, *, progress: Callable[[str], None] | None = None) -> None:
    _run(url, lambda config: command.upgrade(config, revision), progress)


def downgrade(
    url: str, revision: str, *, progress: Callable[[str], None] | None = None, dry_run: bool = False
) -> None:
    """Downgrade to ``revision``. Data revisions report edits they will overwrite
    (through ``progress``); with ``dry_run`` everything runs inside one
    transaction that is rolled back, so the reports and the steps are shown and
    nothing changes."""
    engine = make_engine(url)
    try:
        _refuse_ambiguous_step(engine, revision)
        if not dry_run:
            _run(url, lambda config: command.downgrade(config, revision), progress)
            return
        with _MIGRATING, _echo_progress(progress), database_errors(url), migrating(engine) as conn:
            try:
                with alembic_config(connection=conn) as config:
                    command.downgrade(config, revision)
            except CommandError as exc:
                raise InvalidInput(f"migration refused: {exc}") from None
            finally:
                conn.rollback()
    finally:
        engine.dispose()


def _refuse_ambiguous_step(engine: Engine, revision: str) -> None:
    """``-1`` with two branches applied: alembic would pick one by itself."""
    if not re.fullmatch(r"-\d+", revision):
        return
    entered = [state.branch for state in branch_states(engine) if state.revision is not None]
    if len(entered) > 1:
        raise InvalidInput(
            f"downgrade {revision} is ambiguous: the database follows {len(entered)} branches "
            f"({', '.join(entered)}); name one, e.g. {entered[-1]}@{revision}"
        )


def _run(url: str, action, progress) -> None:
    with _MIGRATING, alembic_config(url=url) as config, _echo_progress(progress), database_errors(url):
        try:
            action(config)
        except CommandError as exc:
            raise InvalidInput(f"migration refused: {exc}") from None


def ensure_schema(engine: Engine) -> None:
    """Bring the tables to the schema head; a no-op (one query) when already there."""
    script = script_directory()
    head = script.get_revision(SCHEMA_HEAD).revision
    if head in applied_revisions(script, current_heads(engine)):
        return
    # Alembic keeps its migration context in module globals: one migration
    # per process at a time.
    with _MIGRATING:
        _upgrade_schema(engine, script, head)


def _upgrade_schema(engine: Engine, script: ScriptDirectory, head: str) -> None:
    if head in applied_revisions(script, current_heads(engine)):
        return
    # A second process doing the same waits on the lock env.py takes and then
    # finds the schema at head.
    with database_errors(engine):
        with migrating(engine) as conn, alembic_config(connection=conn) as config:
            command.upgrade(config, SCHEMA_HEAD)


@contextlib.contextmanager
def _echo_progress(progress: Callable[[str], None] | None) -> Iterator[None]:
    """Show alembic's "Running upgrade a -> b" lines through ``progress``."""
    if progress is None:
        yield
        return
    logger = logging.getLogger("alembic.runtime.migration")

    class Echo(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if message.startswith("Running"):
                # "Running upgrade a -> b, <first line of the revision's doc>"
                progress(message.splitlines()[0])

    class Report(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            progress(record.getMessage())

    handler = Echo(level=logging.INFO)
    edits = logging.getLogger(LATER_EDITS_LOGGER)
    report = Report(level=logging.WARNING)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    edits.addHandler(report)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        edits.removeHandler(report)


def _no_schema(url: object) -> InvalidInput:
    shown = url.url.render_as_string(hide_password=True) if isinstance(url, Engine) else mask_url(str(url))
    return InvalidInput(
        f"catalog database {shown} has no catalog tables (is the path or database name right?); "
        "create them with `lanes db upgrade` (or `lanes catalog apply FILE`)"
    )


def refuse_missing_file(url: str) -> None:
    """A SQLite path that does not exist: refuse before anything creates the file."""
    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError:
        return  # make_engine says what is wrong with it
    database = parsed.database if parsed.get_backend_name() == "sqlite" else None
    if database and database != ":memory:" and not database.startswith("file:"):
        if not Path(database).expanduser().exists():
            raise _no_schema(url)


def refuse_missing_schema(engine: Engine) -> None:
    """A database where the catalog tables were never created."""
    script = script_directory()
    first = script.get_revision(SCHEMA_HEAD)
    while first.down_revision is not None:
        first = script.get_revision(first.down_revision)
    if first.revision not in applied_revisions(script, current_heads(engine)):
        raise _no_schema(engine)


def table_names(engine: Engine) -> list[str]:
    with database_errors(engine), engine.connect() as conn:
        return sorted(sa.inspect(conn).get_table_names())

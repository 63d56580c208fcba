"""Tools for data revisions (imported by files in ``versions/``).

A data revision that changes existing rows first saves them with
:func:`save_backup`; its downgrade puts them back with :func:`take_backup`,
so ``down(up(state)) == state`` row for row, ids included, even when an
operator changed those rows after the fleet was first inserted. A revision
that inserts rows records their ids the same way, and its downgrade deletes
by those ids: names can have changed since (an applied file renames pools).

The backup also keeps the rows as the revision left them (``after``). A
downgrade compares them with the rows it is about to overwrite or delete and
reports each difference through the ``lanes.migrations`` logger before doing
so: an edit made after the upgrade is lost by the downgrade, and the operator
should hear it (``lanes db downgrade --dry-run`` lists them and changes nothing).

Revisions name their columns here explicitly (``sa.table``) instead of
importing the SQLModel classes: a revision must keep meaning what it meant
when it was written, whatever the models look like later.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timezone

import sqlalchemy as sa

pools = sa.table(
    "pools",
    sa.column("id", sa.Integer),
    sa.column("name", sa.String),
    sa.column("width", sa.Integer),
    sa.column("floor", sa.Integer),
    sa.column("ceiling", sa.Integer),
    sa.column("controller_kind", sa.String),
    sa.column("controller_params", sa.JSON),
    sa.column("metrics_url", sa.String),
    sa.column("enabled", sa.Boolean),
    sa.column("previous_names", sa.JSON),
)
models = sa.table(
    "models",
    sa.column("id", sa.Integer),
    sa.column("name", sa.String),
    sa.column("base_url", sa.String),
    sa.column("kind", sa.String),
    sa.column("pool_id", sa.Integer),
    sa.column("service", sa.String),
    sa.column("timeout_ms", sa.Integer),
    sa.column("api_key_env", sa.String),
)
workflows = sa.table(
    "workflows",
    sa.column("id", sa.Integer),
    sa.column("name", sa.String),
    sa.column("priority", sa.String),
    sa.column("reserve_ms", sa.Integer),
    sa.column("deadline_ms", sa.Integer),
)
candidates = sa.table(
    "workflow_candidates",
    sa.column("workflow_id", sa.Integer),
    sa.column("position", sa.Integer),
    sa.column("model_id", sa.Integer),
)
services = sa.table(
    "services",
    sa.column("id", sa.Integer),
    sa.column("name", sa.String),
    sa.column("max_concurrency", sa.Integer),
)
backups = sa.table("revision_backups", sa.column("revision", sa.String), sa.column("payload", sa.JSON))
catalog_version = sa.table(
    "catalog_version",
    sa.column("id", sa.Integer),
    sa.column("version", sa.BigInteger),
    sa.column("changed_at", sa.DateTime(timezone=True)),
    sa.column("identity", sa.String),
)


def bump_version(conn) -> None:
    """Tell running processes the catalog changed (data revisions change it too).

    From catalog_0002 on, the catalog identity is drawn anew as well; a fleet
    revision may run on a schema still at catalog_0001 (it depends on that
    one only), where the column does not exist yet.
    """
    values = {"version": catalog_version.c.version + 1, "changed_at": datetime.now(timezone.utc)}
    if "identity" in {column["name"] for column in sa.inspect(conn).get_columns("catalog_version")}:
        values["identity"] = uuid.uuid4().hex
    conn.execute(catalog_version.update().where(catalog_version.c.id == 1).values(**values))


def rows(conn, table, *where) -> list[dict]:
    query = sa.select(table)
    for clause in where:
        query = query.where(clause)
    return [dict(row._mapping) for row in conn.execute(query)]


def ids_by_name(conn, table) -> dict[str, int]:
    return {name: id_ for id_, name in conn.execute(sa.select(table.c.id, table.c.name))}


def save_backup(conn, revision: str, payload: dict) -> None:
    conn.execute(backups.insert().values(revision=revision, payload=payload))


def take_backup(conn, revision: str) -> dict:
    payload = conn.execute(sa.select(backups.c.payload).where(backups.c.revision == revision)).scalar_one()
    conn.execute(backups.delete().where(backups.c.revision == revision))
    return payload


def take_backup_if_any(conn, revision: str) -> dict | None:
    """The backup of ``revision``, or None when it was applied before it kept one."""
    found = conn.execute(sa.select(backups.c.payload).where(backups.c.revision == revision)).scalar_one_or_none()
    if found is not None:
        conn.execute(backups.delete().where(backups.c.revision == revision))
    return found


# Tables a revision's ``after`` rows may name.
TABLES = {"pools": pools, "models": models, "workflows": workflows, "services": services}
later_edits_log = logging.getLogger("lanes.migrations")


def report_later_edits(conn, revision: str, after: dict, *, undo: str, columns: dict | None = None) -> list[str]:
    """Say which rows changed since ``revision`` left them and will now be ``undo``ne.

    ``after``: table name -> the rows as the revision wrote them (ids included).
    ``columns``: table name -> the columns the downgrade overwrites (default: all
    of them). Returns the lines, each also logged to ``lanes.migrations``.
    """
    lines = []
    for name, recorded in after.items():
        table = TABLES[name]
        wanted = (columns or {}).get(name)
        current = {row["id"]: row for row in rows(conn, table, table.c.id.in_([r["id"] for r in recorded]))}
        for before in recorded:
            now = current.get(before["id"])
            if now is None:
                continue
            changed = [
                f"{column} {before[column]!r} -> {now[column]!r}"
                for column in (wanted or before)
                if column != "id" and _normal(now.get(column)) != _normal(before.get(column))
            ]
            if changed:
                label = now.get("name", before.get("name", ""))
                lines.append(
                    f"{revision} downgrade: {name} id {before['id']} ({label}) was edited after the upgrade "
                    f"and will be {undo}: {'; '.join(changed)}"
                )
    for line in lines:
        later_edits_log.warning(line)
    return lines


def _normal(value):
    """Compare a stored row with its JSON copy: tuples are lists, booleans may be 0/1."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, bool):
        return int(value)
    return value

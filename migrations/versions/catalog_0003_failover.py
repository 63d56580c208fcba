"""A workflow's failover share override.

``workflows.failover`` holds the override of the load-aware failover share
(lanes/catalog/failover.py): NULL for the defaults, ``{"enabled": false}`` to
turn it off, or the parameters that replace the defaults. Existing workflows
get NULL, so every workflow with two or more candidates runs the share with
the defaults; no backfill is needed.

The downgrade removes the column, and with it the overrides, by design: the
schema below has nowhere to keep them. It sets them aside in
``revision_backups`` first (by workflow id and name) and says so, one line per
workflow, through the ``lanes.migrations`` logger (``lanes db downgrade
--dry-run`` shows them); the upgrade puts each back on the workflow that still
has that id and name, and names any it cannot.

Revision ID: catalog_0003
Revises: catalog_0002
"""

import logging
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "catalog_0003"
down_revision: Union[str, Sequence[str], None] = "catalog_0002"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# The columns as this revision knows them (not the SQLModel class, which may change).
workflows = sa.table(
    "workflows", sa.column("id", sa.Integer), sa.column("name", sa.String),
    sa.column("failover", sa.JSON(none_as_null=True)),
)
backups = sa.table("revision_backups", sa.column("revision", sa.String), sa.column("payload", sa.JSON))
log = logging.getLogger("lanes.migrations")


def upgrade() -> None:
    with op.batch_alter_table("workflows") as batch:
        batch.add_column(sa.Column("failover", sa.JSON(none_as_null=True), nullable=True))
    conn = op.get_bind()
    kept = conn.execute(sa.select(backups.c.payload).where(backups.c.revision == revision)).scalar_one_or_none()
    if kept is None:
        return
    conn.execute(backups.delete().where(backups.c.revision == revision))
    names = dict(conn.execute(sa.select(workflows.c.id, workflows.c.name)).all())
    for row in kept["workflows"]:
        if names.get(row["id"]) != row["name"]:
            log.warning(
                f"{revision} upgrade: workflows id {row['id']} ({row['name']}) is gone or renamed since the "
                f"downgrade; its failover override {row['failover']!r} is not restored"
            )
            continue
        conn.execute(workflows.update().where(workflows.c.id == row["id"]).values(failover=row["failover"]))


def downgrade() -> None:
    conn = op.get_bind()
    overrides = [
        {"id": id_, "name": name, "failover": failover}
        for id_, name, failover in conn.execute(
            sa.select(workflows.c.id, workflows.c.name, workflows.c.failover)
            .where(workflows.c.failover.is_not(None)).order_by(workflows.c.id)
        )
    ]
    for row in overrides:
        log.warning(
            f"{revision} downgrade: workflows id {row['id']} ({row['name']}) loses its failover override "
            f"{row['failover']!r} (kept aside in revision_backups; the upgrade restores it)"
        )
    if overrides:
        conn.execute(backups.insert().values(revision=revision, payload={"workflows": overrides}))
    with op.batch_alter_table("workflows") as batch:
        batch.drop_column("failover")

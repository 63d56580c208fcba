"""A hosted model's concurrency limit.

``models.concurrency``: how many calls a model without a pool (a hosted API)
may have in flight at once, fleet-wide (a lane of its own in Redis); NULL for
no limit, which is what every existing model gets.

The downgrade removes the column, and with it the limits, by design: the
schema below has nowhere to keep them. It sets them aside in
``revision_backups`` first (by model id and name) and says so, one line per
model, through the ``lanes.migrations`` logger (``lanes db downgrade
--dry-run`` shows them); the upgrade puts each back on the model that still
has that id and name, and names any it cannot.

Revision ID: catalog_0005
Revises: catalog_0004
"""

import logging
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "catalog_0005"
down_revision: Union[str, Sequence[str], None] = "catalog_0004"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# The columns as this revision knows them (not the SQLModel class, which may change).
models = sa.table(
    "models", sa.column("id", sa.Integer), sa.column("name", sa.String), sa.column("concurrency", sa.Integer),
)
backups = sa.table("revision_backups", sa.column("revision", sa.String), sa.column("payload", sa.JSON))
log = logging.getLogger("lanes.migrations")


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("concurrency", sa.Integer(), nullable=True))
    conn = op.get_bind()
    kept = conn.execute(sa.select(backups.c.payload).where(backups.c.revision == revision)).scalar_one_or_none()
    if kept is None:
        return
    conn.execute(backups.delete().where(backups.c.revision == revision))
    names = dict(conn.execute(sa.select(models.c.id, models.c.name)).all())
    for row in kept["models"]:
        if names.get(row["id"]) != row["name"]:
            log.warning(
                f"{revision} upgrade: models id {row['id']} ({row['name']}) is gone or renamed since the "
                f"downgrade; its concurrency limit {row['concurrency']} is not restored"
            )
            continue
        conn.execute(models.update().where(models.c.id == row["id"]).values(concurrency=row["concurrency"]))


def downgrade() -> None:
    conn = op.get_bind()
    limits = [
        {"id": id_, "name": name, "concurrency": concurrency}
        for id_, name, concurrency in conn.execute(
            sa.select(models.c.id, models.c.name, models.c.concurrency)
            .where(models.c.concurrency.is_not(None)).order_by(models.c.id)
        )
    ]
    for row in limits:
        log.warning(
            f"{revision} downgrade: models id {row['id']} ({row['name']}) loses its concurrency limit "
            f"{row['concurrency']} (kept aside in revision_backups; the upgrade restores it)"
        )
    if limits:
        conn.execute(backups.insert().values(revision=revision, payload={"models": limits}))
    with op.batch_alter_table("models") as batch:
        batch.drop_column("concurrency")

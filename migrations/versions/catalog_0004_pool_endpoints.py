"""A pool's replica endpoints.

``pools.endpoints`` lists the base URLs of a pool's replicas (a JSON list,
``[]`` for a pool reached only through its models' ``base_url``). Calls go
to the replica with the least in flight and the controllers scrape each
apart (lanes/control/replicas.py, lanes/control/scrape.py).

Data is kept both ways: the downgrade saves every non-empty list in
``revision_backups`` before dropping the column, and an upgrade over such a
backup puts the lists back on the pools that still exist (by id, so a pool
renamed in between keeps its replicas).

Revision ID: catalog_0004
Revises: catalog_0003
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

from migrations.helpers import bump_version, save_backup, take_backup_if_any

revision: str = "catalog_0004"
down_revision: Union[str, Sequence[str], None] = "catalog_0003"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

KEPT = "catalog_0004:endpoints"  # the backup a downgrade leaves for the next upgrade

pools = sa.table("pools", sa.column("id", sa.Integer), sa.column("endpoints", sa.JSON))


def upgrade() -> None:
    op.add_column("pools", sa.Column("endpoints", sa.JSON, nullable=False, server_default="[]"))
    conn = op.get_bind()
    kept = take_backup_if_any(conn, KEPT)
    if kept is None:
        return
    present = set(conn.execute(sa.text("SELECT id FROM pools")).scalars())
    restored = 0
    for row in kept["pools"]:
        if row["id"] in present:
            conn.execute(pools.update().where(pools.c.id == row["id"]).values(endpoints=row["endpoints"]))
            restored += 1
    if restored:
        bump_version(conn)


def downgrade() -> None:
    conn = op.get_bind()
    listed = [{"id": row.id, "endpoints": list(row.endpoints)}
              for row in conn.execute(sa.select(pools.c.id, pools.c.endpoints)) if row.endpoints]
    take_backup_if_any(conn, KEPT)  # a backup an earlier downgrade left is replaced
    if listed:
        save_backup(conn, KEPT, {"pools": listed})
    if conn.dialect.name == "sqlite":
        # SQLite (>= 3.35) drops a plain column in place; a batch copy of the table
        # would trip the models' foreign keys to it.
        conn.exec_driver_sql("ALTER TABLE pools DROP COLUMN endpoints")
    else:
        op.drop_column("pools", "endpoints")
    if listed:
        bump_version(conn)

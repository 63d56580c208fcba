"""Catalog identity beside the version.

A random identity of the catalog's current contents, replaced with every
change (apply, set-width, data revisions). The version alone could repeat: a
catalog dropped and created again, or restored from an older backup, counts up
from an old number with other rows. Processes compare (identity, version), so a
repeated number with other contents still reloads.

Revision ID: catalog_0002
Revises: catalog_0001
"""

import uuid
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "catalog_0002"
down_revision: Union[str, Sequence[str], None] = "catalog_0001"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

catalog_version = sa.table("catalog_version", sa.column("id", sa.Integer), sa.column("identity", sa.String))


def upgrade() -> None:
    with op.batch_alter_table("catalog_version") as batch:
        batch.add_column(sa.Column("identity", sa.String(32), nullable=False, server_default=""))
    op.execute(catalog_version.update().where(catalog_version.c.id == 1).values(identity=uuid.uuid4().hex))


def downgrade() -> None:
    with op.batch_alter_table("catalog_version") as batch:
        batch.drop_column("identity")

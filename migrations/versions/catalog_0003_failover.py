"""A workflow's failover share override.

``workflows.failover`` holds the override of the load-aware failover share
(lanes/catalog/failover.py): NULL for the defaults, ``{"enabled": false}`` to
turn it off, or the parameters that replace the defaults. Existing workflows
get NULL, so every workflow with two or more candidates runs the share with
the defaults; no backfill is needed.

Revision ID: catalog_0003
Revises: catalog_0002
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "catalog_0003"
down_revision: Union[str, Sequence[str], None] = "catalog_0002"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("workflows") as batch:
        batch.add_column(sa.Column("failover", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workflows") as batch:
        batch.drop_column("failover")

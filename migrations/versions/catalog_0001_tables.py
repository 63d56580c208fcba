"""Catalog tables.

Pools, models, workflows and their candidates, services, events, the catalog
version and the data revisions' backups.

Revision ID: catalog_0001
Revises:
Branch label: schema (``lanes db upgrade`` and ``open_catalog`` go to schema@head)

The downgrade drops every table and its rows, by design (it is the first
revision: below it there is no catalog). It first says how many rows of each
kind go, through the ``lanes.migrations`` logger (``lanes db downgrade base
--dry-run`` shows it and changes nothing).
"""

import logging
from datetime import datetime, timezone
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "catalog_0001"
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = ("schema",)
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "pools",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("width", sa.Integer, nullable=False),
        sa.Column("floor", sa.Integer, nullable=False),
        sa.Column("ceiling", sa.Integer, nullable=False),
        sa.Column("controller_kind", sa.String(40), nullable=False),
        sa.Column("controller_params", sa.JSON, nullable=False),
        sa.Column("metrics_url", sa.String(500), nullable=True),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("previous_names", sa.JSON, nullable=False),
        sa.UniqueConstraint("name", name="uq_pools_name"),
        sa.CheckConstraint("width >= 1", name="ck_pools_width"),
        sa.CheckConstraint("floor >= 1 AND floor <= ceiling", name="ck_pools_bounds"),
    )
    op.create_table(
        "models",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("base_url", sa.String(500), nullable=False),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("pool_id", sa.Integer, nullable=True),
        sa.Column("service", sa.String(100), nullable=True),
        sa.Column("timeout_ms", sa.Integer, nullable=False),
        sa.Column("api_key_env", sa.String(100), nullable=True),
        sa.UniqueConstraint("name", name="uq_models_name"),
        sa.CheckConstraint("kind IN ('chat', 'embedding')", name="ck_models_kind"),
        sa.CheckConstraint("timeout_ms >= 1", name="ck_models_timeout"),
        sa.ForeignKeyConstraint(["pool_id"], ["pools.id"], name="fk_models_pool", ondelete="RESTRICT"),
    )
    op.create_table(
        "workflows",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("priority", sa.String(20), nullable=False),
        sa.Column("reserve_ms", sa.Integer, nullable=False),
        sa.Column("deadline_ms", sa.Integer, nullable=True),
        sa.UniqueConstraint("name", name="uq_workflows_name"),
        sa.CheckConstraint("priority IN ('interactive', 'user_tool', 'background')", name="ck_workflows_priority"),
        sa.CheckConstraint("reserve_ms >= 0", name="ck_workflows_reserve"),
    )
    op.create_table(
        "workflow_candidates",
        sa.Column("workflow_id", sa.Integer, nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("model_id", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("workflow_id", "position"),
        sa.UniqueConstraint("workflow_id", "model_id", name="uq_workflow_candidates_model"),
        sa.ForeignKeyConstraint(
            ["workflow_id"], ["workflows.id"], name="fk_workflow_candidates_workflow", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], name="fk_workflow_candidates_model", ondelete="RESTRICT"),
    )
    op.create_table(
        "services",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("max_concurrency", sa.Integer, nullable=False),
        sa.UniqueConstraint("name", name="uq_services_name"),
        sa.CheckConstraint("max_concurrency >= 1", name="ck_services_limit"),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(60), nullable=False),
        sa.Column("pool", sa.String(100), nullable=True),
        sa.Column("workflow", sa.String(100), nullable=True),
        sa.Column("detail", sa.JSON, nullable=False),
    )
    op.create_index("ix_events_kind", "events", ["kind"])
    version = op.create_table(
        "catalog_version",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.execute(version.insert().values(id=1, version=0, changed_at=datetime.now(timezone.utc)))
    op.create_table(
        "revision_backups",
        sa.Column("revision", sa.String(32), primary_key=True),
        sa.Column("payload", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    conn = op.get_bind()
    counts = {
        name: conn.execute(sa.select(sa.func.count()).select_from(sa.table(name))).scalar_one()
        for name in ("pools", "models", "workflows", "workflow_candidates", "services", "events")
    }
    if any(counts.values()):
        listed = ", ".join(f"{count} {name}" for name, count in counts.items())
        logging.getLogger("lanes.migrations").warning(
            f"{revision} downgrade: drops every catalog table with its rows ({listed})"
        )
    for table in (
        "revision_backups",
        "catalog_version",
        "events",
        "services",
        "workflow_candidates",
        "workflows",
        "models",
        "pools",
    ):
        op.drop_table(table)

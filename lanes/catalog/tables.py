"""The catalog's tables (SQLModel).

Migrations in ``migrations/versions`` create these tables by hand so that each
revision stays a frozen snapshot; ``tests/catalog/test_migrations.py`` checks
that the two agree. A later table (memory runs, ...) is one more class here and
one more schema revision.

Durations are integer milliseconds in the database (no float drift when a file
is applied twice); the read API in :mod:`lanes.catalog.routing` turns them into
seconds. Pools and models are referenced by id, so a renamed pool keeps its
models, its lane (lane keys are built from the id) and its fleet.
"""

from __future__ import annotations

from datetime import datetime, timezone

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

NAME_LENGTH = 100
MODEL_NAME_LENGTH = 200
URL_LENGTH = 500

PRIORITY_LABELS = ("interactive", "user_tool", "background")
MODEL_KINDS = ("chat", "embedding")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _json_column() -> sa.Column:
    return sa.Column(sa.JSON, nullable=False)


class Pool(SQLModel, table=True):
    """A group of backends loaded through one lane of ``width`` slots."""

    __tablename__ = "pools"
    __table_args__ = (
        sa.UniqueConstraint("name", name="uq_pools_name"),
        sa.CheckConstraint("width >= 1", name="ck_pools_width"),
        sa.CheckConstraint("floor >= 1 AND floor <= ceiling", name="ck_pools_bounds"),
    )

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=NAME_LENGTH)
    width: int
    floor: int
    ceiling: int
    controller_kind: str = Field(default="off", max_length=40)
    controller_params: dict = Field(default_factory=dict, sa_column=_json_column())
    metrics_url: str | None = Field(default=None, max_length=URL_LENGTH)
    # The replicas' base URLs (a JSON list; [] when the models' base_url is the only address).
    endpoints: list = Field(default_factory=list, sa_column=_json_column())
    enabled: bool = True
    # Oldest first. Renames keep the id; these names let people and logs find it.
    previous_names: list = Field(default_factory=list, sa_column=_json_column())


class Model(SQLModel, table=True):
    """A model id as sent to an OpenAI-compatible backend."""

    __tablename__ = "models"
    __table_args__ = (
        sa.UniqueConstraint("name", name="uq_models_name"),
        sa.CheckConstraint("kind IN ('chat', 'embedding')", name="ck_models_kind"),
        sa.CheckConstraint("timeout_ms >= 1", name="ck_models_timeout"),
    )

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=MODEL_NAME_LENGTH)
    base_url: str = Field(max_length=URL_LENGTH)
    kind: str = Field(default="chat", max_length=20)
    # NULL: a hosted API called without a lane.
    pool_id: int | None = Field(
        default=None,
        sa_column=sa.Column(sa.Integer, sa.ForeignKey("pools.id", name="fk_models_pool", ondelete="RESTRICT")),
    )
    # The farm job service serving it; a model with a service belongs in a pool.
    service: str | None = Field(default=None, max_length=NAME_LENGTH)
    timeout_ms: int
    # The *name* of an environment variable; the key itself is never stored.
    api_key_env: str | None = Field(default=None, max_length=NAME_LENGTH)
    # A hosted model's (no pool) fleet-wide limit of calls at once; NULL: unbounded.
    concurrency: int | None = Field(default=None)


class Workflow(SQLModel, table=True):
    """A named kind of work, its lane priority and its candidate models."""

    __tablename__ = "workflows"
    __table_args__ = (
        sa.UniqueConstraint("name", name="uq_workflows_name"),
        sa.CheckConstraint(
            "priority IN ('interactive', 'user_tool', 'background')", name="ck_workflows_priority"
        ),
        sa.CheckConstraint("reserve_ms >= 0", name="ck_workflows_reserve"),
    )

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=NAME_LENGTH)
    priority: str = Field(default="interactive", max_length=20)
    # Time kept back from a busy primary so a fallback can still answer in time.
    reserve_ms: int = 0
    deadline_ms: int | None = None
    # The failover share's override (lanes/catalog/failover.py); NULL: the defaults.
    failover: dict | None = Field(default=None, sa_column=sa.Column(sa.JSON(none_as_null=True), nullable=True))


class Candidate(SQLModel, table=True):
    """One model of a workflow, ``position`` 0 being the primary."""

    __tablename__ = "workflow_candidates"
    __table_args__ = (sa.UniqueConstraint("workflow_id", "model_id", name="uq_workflow_candidates_model"),)

    workflow_id: int = Field(
        sa_column=sa.Column(
            sa.Integer,
            sa.ForeignKey("workflows.id", name="fk_workflow_candidates_workflow", ondelete="CASCADE"),
            primary_key=True,
        )
    )
    position: int = Field(primary_key=True)
    model_id: int = Field(
        sa_column=sa.Column(
            sa.Integer,
            sa.ForeignKey("models.id", name="fk_workflow_candidates_model", ondelete="RESTRICT"),
            nullable=False,
        )
    )


class Service(SQLModel, table=True):
    """A farm job service and how many jobs it runs at once."""

    __tablename__ = "services"
    __table_args__ = (
        sa.UniqueConstraint("name", name="uq_services_name"),
        sa.CheckConstraint("max_concurrency >= 1", name="ck_services_limit"),
    )

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=NAME_LENGTH)
    max_concurrency: int


class Event(SQLModel, table=True):
    """A notable routing event. Append-only; the oldest rows are trimmed."""

    __tablename__ = "events"

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = Field(default_factory=utcnow, sa_type=sa.DateTime(timezone=True))
    kind: str = Field(max_length=60, index=True)
    # Names, not ids: an event outlives the pool or workflow it mentions.
    pool: str | None = Field(default=None, max_length=NAME_LENGTH)
    workflow: str | None = Field(default=None, max_length=NAME_LENGTH)
    detail: dict = Field(default_factory=dict, sa_column=_json_column())


class CatalogVersion(SQLModel, table=True):
    """One row; ``version`` grows by one with every committed catalog change,
    and ``identity`` is drawn anew with it."""

    __tablename__ = "catalog_version"

    id: int = Field(default=1, primary_key=True, sa_column_kwargs={"autoincrement": False})
    version: int = Field(default=0, sa_type=sa.BigInteger)
    # Random, replaced with every change: a version number can repeat (a
    # catalog created again, an older backup restored), the pair cannot.
    identity: str = Field(default="", max_length=32, sa_column_kwargs={"server_default": ""})
    changed_at: datetime = Field(default_factory=utcnow, sa_type=sa.DateTime(timezone=True))


class RevisionBackup(SQLModel, table=True):
    """Rows a data revision replaced, kept so its downgrade restores them exactly."""

    __tablename__ = "revision_backups"

    revision: str = Field(max_length=32, primary_key=True)
    payload: dict = Field(default_factory=dict, sa_column=_json_column())


CATALOG_TABLES = ("pools", "models", "workflows", "workflow_candidates", "services")

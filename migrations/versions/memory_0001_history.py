"""Chat history, memory runs, memory notes and their daily rollups.

Revision ID: memory_0001
Revises: (none; starts the ``memory`` branch)
Depends on: catalog_0001
Branch label: memory (``lanes.memory.open_memory`` and ``lanes db upgrade memory@head``)

A frozen snapshot of ``lanes/memory/tables.py``; tests/memory/test_schema.py
checks that the two agree.
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "memory_0001"
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = ("memory",)
depends_on: Union[str, Sequence[str], None] = "catalog_0001"


def upgrade() -> None:
    op.create_table(
        "chat_messages",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("chat_id", sa.String(200), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.CheckConstraint("role IN ('user', 'assistant', 'system', 'tool')", name="ck_chat_messages_role"),
    )
    op.create_index("ix_chat_messages_hour_chat", "chat_messages", ["hour", "chat_id"])
    op.create_index("ix_chat_messages_chat_at", "chat_messages", ["chat_id", "at"])
    op.create_table(
        "memory_runs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("chat_id", sa.String(200), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.UniqueConstraint("chat_id", "hour", name="uq_memory_runs_chat_hour"),
        sa.CheckConstraint("status IN ('queued', 'running', 'done', 'failed')", name="ck_memory_runs_status"),
        sa.CheckConstraint("attempts >= 0", name="ck_memory_runs_attempts"),
    )
    op.create_index("ix_memory_runs_created", "memory_runs", ["created_at"])
    op.create_index("ix_memory_runs_status", "memory_runs", ["status"])
    op.create_table(
        "memory_notes",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("chat_id", sa.String(200), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("run_id", sa.Integer, nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["memory_runs.id"], name="fk_memory_notes_run", ondelete="CASCADE"),
    )
    op.create_index("ix_memory_notes_chat_hour", "memory_notes", ["chat_id", "hour"])
    op.create_index("ix_memory_notes_run", "memory_notes", ["run_id"])
    op.create_table(
        "memory_rollups",
        sa.Column("day", sa.Date, primary_key=True),
        sa.Column("runs_created", sa.Integer, nullable=False),
        sa.Column("skipped_by_cap", sa.Integer, nullable=False),
    )
    state = op.create_table(
        "memory_enqueue_state",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("backlog_from", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_tick_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.bulk_insert(state, [{"id": 1, "backlog_from": None, "last_tick_at": None}])


def downgrade() -> None:
    op.drop_table("memory_enqueue_state")
    op.drop_table("memory_rollups")
    op.drop_table("memory_notes")
    op.drop_table("memory_runs")
    op.drop_table("chat_messages")

"""The memory tables: chat history, memory runs, memory notes, daily rollups.

They live on their own Alembic branch (``memory``, revision ``memory_0001``)
and on their own ``MetaData``, not on SQLModel's: a catalog without memory
features stays exactly the schema branch, and the schema branch's own
model-versus-migration check never sees these tables.

Times are UTC. ``hour`` columns hold the start of a UTC hour; a message's hour
is stored beside its time so the per-hour scans read one index.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

CHAT_ID_LENGTH = 200
ROLES = ("user", "assistant", "system", "tool")
RUN_STATUSES = ("queued", "running", "done", "failed")

messages_t = sa.Table(
    "chat_messages",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("chat_id", sa.String(CHAT_ID_LENGTH), nullable=False),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
    sa.Column("role", sa.String(20), nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    # sha256 of (chat, time, role, text): importing the same message twice
    # stores it once (insert-or-skip against the unique index).
    sa.Column("digest", sa.String(64), nullable=False),
    # When it was stored (NULL: before memory_0002): a tick also scans the
    # hours of messages stored since the previous tick, however old.
    sa.Column("added_at", sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("role IN ('user', 'assistant', 'system', 'tool')", name="ck_chat_messages_role"),
    sa.Index("ix_chat_messages_hour_chat", "hour", "chat_id"),
    sa.Index("ix_chat_messages_chat_at", "chat_id", "at"),
    sa.Index("uq_chat_messages_digest", "digest", unique=True),
    sa.Index("ix_chat_messages_added_at", "added_at"),
)

runs_t = sa.Table(
    "memory_runs",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("chat_id", sa.String(CHAT_ID_LENGTH), nullable=False),
    sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("error", sa.Text, nullable=True),
    # The claim of the attempt running it and until when it holds (renewed
    # while it runs): a second delivery finds the claim live and leaves the
    # run alone; a claim whose lease has passed belongs to a dead worker and
    # the next tick reclaims the run.
    sa.Column("claim", sa.String(32), nullable=True),
    sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
    # The broker epoch its message was sent in (NULL: not sent). A queued run
    # is sent again only when this is not the broker's current epoch: its
    # message was never sent, or Redis lost it.
    sa.Column("sent_epoch", sa.String(32), nullable=True),
    # Messages of its hour arrived while it ran: it runs again when it ends.
    sa.Column("rerun", sa.Boolean, nullable=False, server_default=sa.false()),
    # The idempotency of enqueuing rests on this: insert-or-skip against it.
    sa.UniqueConstraint("chat_id", "hour", name="uq_memory_runs_chat_hour"),
    sa.CheckConstraint("status IN ('queued', 'running', 'done', 'failed')", name="ck_memory_runs_status"),
    sa.CheckConstraint("attempts >= 0", name="ck_memory_runs_attempts"),
    sa.Index("ix_memory_runs_created", "created_at"),
    sa.Index("ix_memory_runs_status", "status"),
)

notes_t = sa.Table(
    "memory_notes",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("chat_id", sa.String(CHAT_ID_LENGTH), nullable=False),
    sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column(
        "run_id",
        sa.Integer,
        sa.ForeignKey("memory_runs.id", name="fk_memory_notes_run", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Index("ix_memory_notes_chat_hour", "chat_id", "hour"),
    sa.Index("ix_memory_notes_run", "run_id"),
)

rollups_t = sa.Table(
    "memory_rollups",
    metadata,
    # The UTC day, as its midnight.
    sa.Column("day", sa.Date, primary_key=True),
    sa.Column("runs_created", sa.Integer, nullable=False),
    # The most chat hours the daily cap held back at one tick that day.
    sa.Column("skipped_by_cap", sa.Integer, nullable=False),
    # Chat hours the cap held back until they left the retention window.
    sa.Column("expired_by_retention", sa.Integer, nullable=False, server_default="0"),
)

# One row. Enqueuers lock it (FOR UPDATE) so that two of them count the cap
# one after the other; ``backlog_from`` is the oldest hour the cap held back.
enqueue_state_t = sa.Table(
    "memory_enqueue_state",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("backlog_from", sa.DateTime(timezone=True), nullable=True),
    sa.Column("last_tick_at", sa.DateTime(timezone=True), nullable=True),
)

MEMORY_TABLES = ("chat_messages", "memory_runs", "memory_notes", "memory_rollups", "memory_enqueue_state")

"""Run claims with a lease, the broker epoch of a run's message, reruns, message digests.

Revision ID: memory_0002
Revises: memory_0001

- ``memory_runs.claim``, ``lease_until``: the attempt that runs a run, until when;
- ``memory_runs.sent_epoch``: the broker epoch its message was sent in;
- ``memory_runs.rerun``: messages of its hour arrived while it ran;
- ``memory_rollups.expired_by_retention``: hours the cap held past the window;
- ``chat_messages.added_at`` (indexed; NULL for rows stored before): a tick
  also scans the hours of messages stored since the previous tick;
- ``chat_messages.digest`` with a unique index: a message imported twice is
  stored once. Existing rows get their digest here; exact duplicates a
  repeated import left behind (same chat, time, role and text) are folded
  into their first copy, the only rows this revision removes.

The downgrade drops the new columns and index and keeps every row.

A frozen snapshot of ``lanes/memory/tables.py``; tests/memory/test_schema.py
checks that the two agree.
"""

import hashlib
from datetime import timezone
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "memory_0002"
down_revision: Union[str, Sequence[str], None] = "memory_0001"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def _digest(chat_id: str, at, role: str, text: str) -> str:
    # Frozen copy of lanes.memory.history.message_digest.
    at = at.replace(tzinfo=timezone.utc) if at.tzinfo is None else at.astimezone(timezone.utc)
    raw = "\x1f".join((chat_id, at.isoformat(timespec="microseconds"), role, text))
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def upgrade() -> None:
    with op.batch_alter_table("memory_runs") as batch:
        batch.add_column(sa.Column("claim", sa.String(32), nullable=True))
        batch.add_column(sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("sent_epoch", sa.String(32), nullable=True))
        batch.add_column(sa.Column("rerun", sa.Boolean, nullable=False, server_default=sa.false()))
    with op.batch_alter_table("memory_rollups") as batch:
        batch.add_column(sa.Column("expired_by_retention", sa.Integer, nullable=False, server_default="0"))

    with op.batch_alter_table("chat_messages") as batch:
        batch.add_column(sa.Column("digest", sa.String(64), nullable=True))
        batch.add_column(sa.Column("added_at", sa.DateTime(timezone=True), nullable=True))
        batch.create_index("ix_chat_messages_added_at", ["added_at"])
    conn = op.get_bind()
    messages = sa.table(
        "chat_messages", sa.column("id", sa.Integer), sa.column("chat_id", sa.String),
        sa.column("at", sa.DateTime(timezone=True)), sa.column("role", sa.String), sa.column("text", sa.Text),
        sa.column("digest", sa.String),
    )
    seen: dict[str, int] = {}
    duplicates: list[int] = []
    updates: list[dict] = []
    rows = conn.execute(sa.select(messages.c.id, messages.c.chat_id, messages.c.at, messages.c.role,
                                  messages.c.text).order_by(messages.c.id))
    for row in rows:
        digest = _digest(row.chat_id, row.at, row.role, row.text)
        if digest in seen:
            duplicates.append(row.id)
        else:
            seen[digest] = row.id
            updates.append({"row_id": row.id, "new_digest": digest})
    if duplicates:
        for start in range(0, len(duplicates), 500):
            conn.execute(messages.delete().where(messages.c.id.in_(duplicates[start:start + 500])))
    if updates:
        conn.execute(
            messages.update().where(messages.c.id == sa.bindparam("row_id")).values(digest=sa.bindparam("new_digest")),
            updates,
        )
    with op.batch_alter_table("chat_messages") as batch:
        batch.alter_column("digest", existing_type=sa.String(64), nullable=False)
        batch.create_index("uq_chat_messages_digest", ["digest"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("chat_messages") as batch:
        batch.drop_index("uq_chat_messages_digest")
        batch.drop_index("ix_chat_messages_added_at")
        batch.drop_column("added_at")
        batch.drop_column("digest")
    with op.batch_alter_table("memory_rollups") as batch:
        batch.drop_column("expired_by_retention")
    with op.batch_alter_table("memory_runs") as batch:
        batch.drop_column("rerun")
        batch.drop_column("sent_epoch")
        batch.drop_column("lease_until")
        batch.drop_column("claim")

"""Lane priorities and fallback reserves of the reference workflows.


Dialog is interactive and keeps 30 s back for its fallbacks; history summary,
YouTube and the media optimizer are user tools keeping 10 s for the hosted
fallback; image and music are user tools with nothing to fall back to; memory
extraction and subject merge are background work with no reserve. Speech
recognition, embeddings and redaction stay interactive (callers writing
memories pass background priority per request).

Revision ID: fleet_0002
Revises: fleet_0001

The downgrade restores each workflow's previous priority and reserve from
revision_backups, whatever they were, and first reports the workflows whose
priority or reserve was edited after the upgrade (those edits are lost).
"""

from typing import Sequence, Union

from alembic import op

from migrations.helpers import bump_version, report_later_edits, rows, save_backup, take_backup, workflows

revision: str = "fleet_0002"
down_revision: Union[str, Sequence[str], None] = "fleet_0001"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# name -> (priority, reserve_ms)
LANES = {
    "dialog": ("interactive", 30_000),
    "history_summary": ("user_tool", 10_000),
    "youtube": ("user_tool", 10_000),
    "media_optimizer": ("user_tool", 10_000),
    "image": ("user_tool", 0),
    "music": ("user_tool", 0),
    "speech_recognition": ("interactive", 0),
    "memory_extraction": ("background", 0),
    "subject_merge": ("background", 0),
    "embeddings": ("interactive", 0),
    "redaction": ("interactive", 0),
}


def upgrade() -> None:
    conn = op.get_bind()
    before = rows(conn, workflows, workflows.c.name.in_(list(LANES)))
    for row in before:
        priority, reserve = LANES[row["name"]]
        conn.execute(
            workflows.update().where(workflows.c.id == row["id"]).values(priority=priority, reserve_ms=reserve)
        )
    after = rows(conn, workflows, workflows.c.id.in_([row["id"] for row in before]))
    save_backup(conn, revision, {"workflows": before, "after": {"workflows": after}})
    bump_version(conn)


def downgrade() -> None:
    conn = op.get_bind()
    saved = take_backup(conn, revision)
    if "after" in saved:
        columns = {"workflows": ["priority", "reserve_ms"]}
        report_later_edits(conn, revision, saved["after"], undo="restored", columns=columns)
    for row in saved["workflows"]:
        conn.execute(
            workflows.update()
            .where(workflows.c.id == row["id"])
            .values(priority=row["priority"], reserve_ms=row["reserve_ms"])
        )
    bump_version(conn)

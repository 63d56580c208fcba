"""Lane pools: rename in place, widen, one sequential GPU1 media lane.

Rename the pools in place to aifarm-<device>-<purpose>, widen the
embedder and privacy pools, and put GPU1's draw, music and speech recognition
models in one sequential lane.

    dialog-gpu   -> aifarm-gpu0-dialog    width 4
    reasoner-gpu -> aifarm-gpu2-utility   width 6
    draw         -> aifarm-gpu1-media     width 1 (ceiling 1: GPU1 runs one job at a time)
    music, asr   -> merged into aifarm-gpu1-media (their models move; the pools go)
    embeddings   -> aifarm-embedder       width 8
    privacy      -> aifarm-gpu1-privacy   width 4

Pool ids do not change, so lanes (keyed by id) and fleets carry over. Each
renamed pool records its old name in previous_names. Every replaced pool row
and every moved model's pool are saved in revision_backups; the downgrade puts
them back exactly, ids included, after reporting the rows edited since.

Revision ID: fleet_0003
Revises: fleet_0002
"""

from typing import Sequence, Union

from alembic import op

from migrations.helpers import bump_version, models, pools, report_later_edits, rows, save_backup, take_backup

revision: str = "fleet_0003"
down_revision: Union[str, Sequence[str], None] = "fleet_0002"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# old name -> (new name, width, ceiling)
RENAMES = {
    "dialog-gpu": ("aifarm-gpu0-dialog", 4, 8),
    "reasoner-gpu": ("aifarm-gpu2-utility", 6, 12),
    "draw": ("aifarm-gpu1-media", 1, 1),
    "embeddings": ("aifarm-embedder", 8, 16),
    "privacy": ("aifarm-gpu1-privacy", 4, 8),
}
# absorbed pool -> the old name of the pool that absorbs it
MERGES = {"music": "draw", "asr": "draw"}


def upgrade() -> None:
    conn = op.get_bind()
    before = {row["name"]: row for row in rows(conn, pools, pools.c.name.in_([*RENAMES, *MERGES]))}
    absorbed_ids = [before[name]["id"] for name in MERGES if name in before]
    moved = rows(conn, models, models.c.pool_id.in_(absorbed_ids)) if absorbed_ids else []
    for absorbed, target in MERGES.items():
        if absorbed in before and target in before:
            conn.execute(
                models.update().where(models.c.pool_id == before[absorbed]["id"]).values(pool_id=before[target]["id"])
            )
            conn.execute(pools.delete().where(pools.c.id == before[absorbed]["id"]))
    for old, (new, width, ceiling) in RENAMES.items():
        if old in before:
            row = before[old]
            conn.execute(
                pools.update()
                .where(pools.c.id == row["id"])
                .values(
                    name=new,
                    width=width,
                    floor=min(row["floor"], width),
                    ceiling=ceiling,
                    previous_names=[*row["previous_names"], old],
                )
            )
    kept_ids = [before[old]["id"] for old in RENAMES if old in before]
    save_backup(
        conn,
        revision,
        {
            "pools": sorted(before.values(), key=lambda row: row["id"]),
            "models": [{"id": row["id"], "pool_id": row["pool_id"]} for row in moved],
            "after": {
                "pools": rows(conn, pools, pools.c.id.in_(kept_ids)),
                "models": [
                    {"id": row["id"], "name": row["name"], "pool_id": row["pool_id"]}
                    for row in rows(conn, models, models.c.id.in_([row["id"] for row in moved]))
                ],
            },
        },
    )
    bump_version(conn)


def downgrade() -> None:
    conn = op.get_bind()
    saved = take_backup(conn, revision)
    if "after" in saved:
        report_later_edits(conn, revision, saved["after"], undo="restored", columns={"models": ["pool_id"]})
    present = {row["id"] for row in rows(conn, pools)}
    for row in saved["pools"]:
        if row["id"] in present:
            conn.execute(pools.update().where(pools.c.id == row["id"]).values(**row))
        else:
            conn.execute(pools.insert().values(**row))
    for row in saved["models"]:
        conn.execute(models.update().where(models.c.id == row["id"]).values(pool_id=row["pool_id"]))
    bump_version(conn)

"""Reference fleet under its old pool names.

The fleet as it ran before lanes: seven pools under their old names,
their models (all served by the built-in simulator), farm services and the
eleven workflows, every workflow interactive with no fallback reserve.

Revision ID: fleet_0001
Revises: (none; starts the opt-in ``fleet`` branch)
Depends on: catalog_0001

Opt in with ``lanes db upgrade fleet@head``; undo with ``lanes db downgrade fleet@base``.
The downgrade deletes exactly the rows this revision inserted, by the ids it
recorded in revision_backups (an applied file may have renamed them since), and
first reports each of those rows edited after the upgrade. Databases upgraded
before the ids were recorded fall back to the original names.
"""

from typing import Sequence, Union

from alembic import op

from migrations.helpers import (
    bump_version,
    candidates,
    ids_by_name,
    models,
    pools,
    report_later_edits,
    rows,
    save_backup,
    services,
    take_backup_if_any,
    workflows,
)

revision: str = "fleet_0001"
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = ("fleet",)
depends_on: Union[str, Sequence[str], None] = "catalog_0001"

SIM = "http://127.0.0.1:8700/v1"

# name, width, ceiling
POOLS = [
    ("dialog-gpu", 4, 8),
    ("reasoner-gpu", 6, 12),
    ("draw", 1, 1),
    ("music", 1, 1),
    ("asr", 2, 2),
    ("embeddings", 4, 8),
    ("privacy", 2, 4),
]
# name, kind, pool, service, timeout_ms, api_key_env
MODELS = [
    ("dialog-27b", "chat", "dialog-gpu", "llm-dialog", 120_000, None),
    ("utility-14b", "chat", "reasoner-gpu", "llm-utility", 180_000, None),
    ("draw-xl", "chat", "draw", "draw", 300_000, None),
    ("music-gen", "chat", "music", "music", 300_000, None),
    ("whisper-large", "chat", "asr", "asr", 120_000, None),
    ("embed-m3", "embedding", "embeddings", "embed", 30_000, None),
    ("redactor-8b", "chat", "privacy", "privacy", 60_000, None),
    ("hosted-fallback", "chat", None, None, 60_000, "LANES_HOSTED_API_KEY"),
]
SERVICES = [
    ("llm-dialog", 4),
    ("llm-utility", 6),
    ("draw", 1),
    ("music", 1),
    ("asr", 2),
    ("embed", 8),
    ("privacy", 4),
]
# name, deadline_ms, candidates (primary first)
WORKFLOWS = [
    ("dialog", 120_000, ["dialog-27b", "utility-14b", "hosted-fallback"]),
    ("history_summary", None, ["utility-14b", "hosted-fallback"]),
    ("youtube", None, ["utility-14b", "hosted-fallback"]),
    ("media_optimizer", None, ["utility-14b", "hosted-fallback"]),
    ("image", None, ["draw-xl"]),
    ("music", None, ["music-gen"]),
    ("speech_recognition", None, ["whisper-large"]),
    ("memory_extraction", None, ["utility-14b"]),
    ("subject_merge", None, ["utility-14b"]),
    ("embeddings", None, ["embed-m3"]),
    ("redaction", None, ["redactor-8b"]),
]


def upgrade() -> None:
    conn = op.get_bind()
    conn.execute(
        pools.insert(),
        [
            dict(
                name=name,
                width=width,
                floor=1,
                ceiling=ceiling,
                controller_kind="off",
                controller_params={},
                metrics_url=None,
                enabled=True,
                previous_names=[],
            )
            for name, width, ceiling in POOLS
        ],
    )
    pool_ids = ids_by_name(conn, pools)
    conn.execute(
        models.insert(),
        [
            dict(
                name=name,
                base_url=SIM,
                kind=kind,
                pool_id=pool_ids[pool] if pool else None,
                service=service,
                timeout_ms=timeout,
                api_key_env=key_env,
            )
            for name, kind, pool, service, timeout, key_env in MODELS
        ],
    )
    conn.execute(services.insert(), [dict(name=name, max_concurrency=limit) for name, limit in SERVICES])
    conn.execute(
        workflows.insert(),
        [
            dict(name=name, priority="interactive", reserve_ms=0, deadline_ms=deadline)
            for name, deadline, _ in WORKFLOWS
        ],
    )
    model_ids = ids_by_name(conn, models)
    workflow_ids = ids_by_name(conn, workflows)
    conn.execute(
        candidates.insert(),
        [
            dict(workflow_id=workflow_ids[name], position=position, model_id=model_ids[model])
            for name, _, names in WORKFLOWS
            for position, model in enumerate(names)
        ],
    )
    inserted = {
        "pools": rows(conn, pools, pools.c.id.in_([pool_ids[name] for name, _, _ in POOLS])),
        "models": rows(conn, models, models.c.id.in_([model_ids[m[0]] for m in MODELS])),
        "services": rows(conn, services, services.c.name.in_([name for name, _ in SERVICES])),
        "workflows": rows(conn, workflows, workflows.c.id.in_([workflow_ids[w[0]] for w in WORKFLOWS])),
    }
    save_backup(conn, revision, {"after": inserted})
    bump_version(conn)


def downgrade() -> None:
    conn = op.get_bind()
    saved = take_backup_if_any(conn, revision)
    if saved is None:
        _downgrade_by_name(conn)
    else:
        inserted = saved["after"]
        report_later_edits(conn, revision, inserted, undo="deleted")
        ids = {table: [row["id"] for row in found] for table, found in inserted.items()}
        conn.execute(candidates.delete().where(candidates.c.workflow_id.in_(ids["workflows"])))
        conn.execute(workflows.delete().where(workflows.c.id.in_(ids["workflows"])))
        conn.execute(models.delete().where(models.c.id.in_(ids["models"])))
        conn.execute(services.delete().where(services.c.id.in_(ids["services"])))
        conn.execute(pools.delete().where(pools.c.id.in_(ids["pools"])))
    bump_version(conn)


def _downgrade_by_name(conn) -> None:
    """For a database upgraded before this revision recorded its ids."""
    workflow_ids = [id_ for name, id_ in ids_by_name(conn, workflows).items() if name in {w[0] for w in WORKFLOWS}]
    conn.execute(candidates.delete().where(candidates.c.workflow_id.in_(workflow_ids)))
    conn.execute(workflows.delete().where(workflows.c.id.in_(workflow_ids)))
    conn.execute(models.delete().where(models.c.name.in_([m[0] for m in MODELS])))
    conn.execute(services.delete().where(services.c.name.in_([s[0] for s in SERVICES])))
    conn.execute(pools.delete().where(pools.c.name.in_([p[0] for p in POOLS])))

"""Controllers redefined: every pool's controller in the new stored form.

The controller kinds were renamed and re-parameterised when the adaptive
controllers were built (lanes/catalog/controllers.py), and a pool may now
run several. Stored form: ``controller_kind`` is ``off`` or the kinds joined
by commas (sorted); ``controller_params`` maps each kind to its parameters.

    overload {step, backoff, interval_seconds}  -> overload {cut_factor = backoff, interval_seconds}
                                                   (the additive step is gone: growth is multiplicative)
    vllm_gauges {target_waiting, interval_s.}   -> vllm {waiting_threshold = target_waiting, interval_seconds}
    utilisation {target, interval_seconds}      -> utilisation {target, interval_seconds}
    latency {...}                               -> off (no latency controller runs)

Parameters not carried over take their defaults. Every changed row is saved
in revision_backups; the downgrade restores them exactly.

Revision ID: fleet_0004
Revises: fleet_0003
"""

from typing import Sequence, Union

from alembic import op

from migrations.helpers import bump_version, pools, rows, save_backup, take_backup

revision: str = "fleet_0004"
down_revision: Union[str, Sequence[str], None] = "fleet_0003"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# Frozen copies of the defaults as they were when this revision was written.
DEFAULTS = {
    "overload": {"cut_factor": 0.8, "growth_factor": 1.5, "interval_seconds": 5.0,
                 "probe_fraction": 0.05, "statuses": [529]},
    "vllm": {"growth_fraction": 0.5, "interval_seconds": 5.0, "kv_threshold": 0.98, "max_cut": 0.5,
             "near_full": 0.8, "probe_fraction": 0.05, "scrape_seconds": 12.0, "stale_seconds": 60.0,
             "timeout_seconds": 2.0, "waiting_threshold": 0},
    "utilisation": {"interval_seconds": 5.0, "max_rise": 2.0, "max_window_intervals": 30, "min_completions": 20, "min_intervals": 6,
                    "scrape_seconds": 12.0, "target": 0.85, "timeout_seconds": 2.0, "tolerance": 0.05},
}
NEW_KINDS = set(DEFAULTS)


def converted(kind: str, params: dict) -> tuple[str, dict]:
    """The new stored pair for one legacy (kind, flat parameters) pair."""
    interval = {"interval_seconds": float(params["interval_seconds"])} if "interval_seconds" in params else {}
    if kind == "overload":
        carried = {**interval, **({"cut_factor": float(params["backoff"])} if "backoff" in params else {})}
    elif kind == "vllm_gauges":
        kind = "vllm"
        carried = {**interval, **({"waiting_threshold": int(params["target_waiting"])} if "target_waiting" in params else {})}
    elif kind == "utilisation":
        carried = {**interval, **({"target": float(params["target"])} if "target" in params else {})}
    else:
        return "off", {}
    return kind, {kind: {**DEFAULTS[kind], **carried}}


def _legacy(row: dict) -> bool:
    kinds = [k for k in row["controller_kind"].split(",") if k != "off"]
    if not kinds:
        return bool(row["controller_params"])
    params = row["controller_params"] or {}
    return not (set(kinds) <= NEW_KINDS and set(params) == set(kinds))


def upgrade() -> None:
    conn = op.get_bind()
    legacy = [row for row in rows(conn, pools) if _legacy(row)]
    save_backup(conn, revision, {"pools": [
        {"id": row["id"], "controller_kind": row["controller_kind"], "controller_params": row["controller_params"]}
        for row in legacy
    ]})
    for row in legacy:
        kind, params = converted(row["controller_kind"], dict(row["controller_params"] or {}))
        conn.execute(pools.update().where(pools.c.id == row["id"]).values(controller_kind=kind, controller_params=params))
    if legacy:
        bump_version(conn)


def downgrade() -> None:
    conn = op.get_bind()
    saved = take_backup(conn, revision)
    for row in saved["pools"]:
        conn.execute(pools.update().where(pools.c.id == row["id"]).values(
            controller_kind=row["controller_kind"], controller_params=row["controller_params"]))
    if saved["pools"]:
        bump_version(conn)

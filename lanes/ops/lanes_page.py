"""One row per catalog pool for an operator's page (Flower's Lanes page).

Every pool of the catalog has a row, with or without live workers: the
lane's row (:func:`lanes.ops.pools.pool_reports`), what waits for the
pool's fleet in the broker (:mod:`lanes.ops.broker`; a pool that is no
fleet's primary has no queue of its own), and the lane waits per priority
over a recent window (:mod:`lanes.ops.waits`).
"""

from __future__ import annotations

from lanes.catalog import load_routing
from lanes.celery_client import broker_client, fleet_names
from lanes.ops.broker import broker_queued
from lanes.ops.pools import pool_reports, public_row
from lanes.ops.waits import WINDOW_SECONDS, recent_waits


def lanes_page(client, *, window: float = WINDOW_SECONDS) -> dict:
    """``{"pools": [...], "window_seconds": ..., "warning": ...}`` for the page."""
    rows, warning = pool_reports(client)
    fleets = set(fleet_names(load_routing(client.engine)))
    broker = broker_queued(broker_client(client.settings, client.redis), fleets & {row["pool"] for row in rows})
    waits = recent_waits(client.redis, prefix=client.settings.key_prefix, window=window)
    shown = []
    for row in rows:
        row = public_row(row)  # the page is for operators who may not hold the API's admin token
        control = row.get("control") or {}
        shown.append({
            **row,
            "fleet": row["pool"] in fleets,
            "broker_queued": broker.get(row["pool"]),
            "recent_waits": waits.get(row["pool"], {}),
            "last_decision": control.get("decision"),
            "last_reason": control.get("reason"),
        })
    return {"pools": shown, "window_seconds": window, "warning": warning}

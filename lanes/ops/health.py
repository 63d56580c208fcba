"""Readiness: can this process serve (Redis and the catalog answer)?

The ``lane_config`` detail (the last lane-config check's findings,
:func:`lanes.lanecheck.readiness_detail`) is reported beside them and never
makes readiness fail: a mismatch is for people to fix, not a reason to take a
process out of service.
"""

from __future__ import annotations

from lanes.catalog import catalog_version
from lanes.catalog.engine import first_line
from lanes.lanecheck import readiness_detail
from lanes.settings import mask_url


def readiness(client) -> tuple[bool, dict]:
    """(ready, detail): ready when both Redis and the catalog database answer."""
    checks = {"redis": _redis(client), "database": _database(client)}
    ready = all(check["ok"] for check in checks.values())
    if checks["redis"]["ok"]:
        checks["lane_config"] = readiness_detail(client.redis, prefix=client.settings.key_prefix)
    else:
        checks["lane_config"] = {"ok": None, "fails_readiness": False, "note": "not read: Redis did not answer"}
    return ready, {"ready": ready, "checks": checks}


def _redis(client) -> dict:
    try:
        client.redis.ping()
    except Exception as exc:  # any failure is an answer here, never an error page
        where = mask_url(client.settings.redis_url) or "the embedded server"
        return {"ok": False, "error": f"Redis at {where} did not answer: {first_line(exc)}"}
    return {"ok": True}


def _database(client) -> dict:
    try:
        # The version row: the database answers and holds a catalog.
        version = catalog_version(client.engine)
    except Exception as exc:
        url = mask_url(client.settings.catalog_url())
        return {"ok": False, "error": f"catalog database {url} cannot be read: {first_line(exc)}"}
    return {"ok": True, "catalog_version": version}

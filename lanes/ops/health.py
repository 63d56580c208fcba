"""Readiness: can this process serve (Redis and the catalog answer)?

The ``lane_config`` detail (the last lane-config check's findings,
:func:`lanes.ops.lanecheck.readiness_detail`) is reported beside them and never
makes readiness fail: a mismatch is for people to fix, not a reason to take a
process out of service.

Readiness is answered to anyone, so its errors name the kind of failure and
the setting to check, never the host, user or database of a URL (those go
to the process's own log, masked).
"""

from __future__ import annotations

import logging

from lanes.catalog import catalog_version
from lanes.ops.lanecheck import readiness_detail
from lanes.settings import mask_url

log = logging.getLogger("lanes.health")


def readiness(client) -> tuple[bool, dict]:
    """(ready, detail): ready when both Redis and the catalog database answer.

    Not ready, ``detail`` is the API's one error shape (``error``,
    ``message``) with the checks beside it.
    """
    checks = {"redis": _redis(client), "database": _database(client)}
    ready = all(check["ok"] for check in checks.values())
    failed = [check["error"] for check in checks.values() if not check["ok"]]
    if checks["redis"]["ok"]:
        checks["lane_config"] = readiness_detail(client.redis, prefix=client.settings.key_prefix)
    else:
        checks["lane_config"] = {"ok": None, "fails_readiness": False, "note": "not read: Redis did not answer"}
    if failed:
        return ready, {"error": "not_ready", "message": "; ".join(failed), "ready": ready, "checks": checks}
    return ready, {"ready": ready, "checks": checks}


def _redis(client) -> dict:
    try:
        client.redis.ping()
    except Exception as exc:  # any failure is an answer here, never an error page
        log.warning("not ready: Redis at %s: %s", mask_url(client.settings.redis_url) or "(embedded)", exc)
        return {"ok": False, "error": f"Redis did not answer ({type(exc).__name__}); check that it runs and "
                                      "LANES_REDIS_URL where this process runs"}
    return {"ok": True}


def _database(client) -> dict:
    try:
        # The version row: the database answers and holds a catalog.
        version = catalog_version(client.engine)
    except Exception as exc:
        log.warning("not ready: catalog database %s: %s", mask_url(client.settings.catalog_url()), exc)
        return {"ok": False, "error": f"the catalog database cannot be read ({type(exc).__name__}); check that it "
                                      "runs, LANES_DATABASE_URL, and `lanes db upgrade`"}
    return {"ok": True, "catalog_version": version}

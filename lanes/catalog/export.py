"""The catalog as a document again: what ``lanes catalog export`` and ``show --json`` print.

An exported document re-applies as a no-op: it carries every field, in the
normalised form ``apply`` compares (controller parameters with their defaults
filled in, ceilings explicit).
"""

from __future__ import annotations

from sqlalchemy.engine import Engine

from lanes.catalog import controllers
from lanes.catalog.document import CatalogDocument
from lanes.catalog.engine import database_errors, reading
from lanes.catalog.state import CatalogState, read_state


def read_catalog(engine: Engine) -> CatalogState:
    with database_errors(engine), reading(engine) as conn:
        return read_state(conn)


def to_document(catalog: CatalogDocument) -> dict:
    """A plain dict in the file format (None where a key is unset)."""
    return {
        "pools": [
            {
                "name": p.name,
                "width": p.width,
                "floor": p.floor,
                "ceiling": p.ceiling,
                "enabled": p.enabled,
                "metrics_url": p.metrics_url,
                **({"endpoints": list(p.endpoints)} if p.endpoints else {}),
                "controller": controllers.file_form(p.controller_kind, p.controller_params),
                "previous_names": list(p.previous_names),
            }
            for p in catalog.pools
        ],
        "models": [
            {
                "name": m.name,
                "base_url": m.base_url,
                "kind": m.kind,
                "pool": m.pool,
                "service": m.service,
                "timeout_ms": m.timeout_ms,
                "api_key_env": m.api_key_env,
                **({"concurrency": m.concurrency} if m.concurrency is not None else {}),
            }
            for m in catalog.models
        ],
        "workflows": [
            {
                "name": w.name,
                "priority": w.priority,
                "reserve_ms": w.reserve_ms,
                "deadline_ms": w.deadline_ms,
                "candidates": list(w.candidates),
                "failover": w.failover,
            }
            for w in catalog.workflows
        ],
        "services": [{"name": s.name, "limit": s.limit} for s in catalog.services],
    }


def export_document(engine: Engine) -> dict:
    return to_document(read_catalog(engine).document())

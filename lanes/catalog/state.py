"""What the catalog database holds, read in one consistent snapshot.

Everything else reads through :func:`read_state`: the diff of ``apply``, the
export, ``show`` and the routing table. The result is the document's own
normalised form (``PoolSpec`` and friends) plus each row's id, so comparing the
database with a file is comparing two values of the same type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from lanes.catalog.document import CatalogDocument, ModelSpec, PoolSpec, ServiceSpec, WorkflowSpec
from lanes.catalog.tables import Candidate, CatalogVersion, Model, Pool, Service, Workflow

T = TypeVar("T")

pools_t = Pool.__table__
models_t = Model.__table__
workflows_t = Workflow.__table__
candidates_t = Candidate.__table__
services_t = Service.__table__
version_t = CatalogVersion.__table__


@dataclass(frozen=True)
class Row(Generic[T]):
    id: int
    spec: T


@dataclass(frozen=True)
class CatalogState:
    version: int
    identity: str
    # name -> row, in id order (dicts keep insertion order)
    pools: dict[str, Row[PoolSpec]] = field(default_factory=dict)
    models: dict[str, Row[ModelSpec]] = field(default_factory=dict)
    workflows: dict[str, Row[WorkflowSpec]] = field(default_factory=dict)
    services: dict[str, Row[ServiceSpec]] = field(default_factory=dict)

    def document(self) -> CatalogDocument:
        return CatalogDocument(
            pools=tuple(row.spec for row in self.pools.values()),
            models=tuple(row.spec for row in self.models.values()),
            workflows=tuple(row.spec for row in self.workflows.values()),
            services=tuple(row.spec for row in self.services.values()),
        )


def read_version(conn: Connection) -> int:
    return int(conn.execute(sa.select(version_t.c.version).where(version_t.c.id == 1)).scalar_one())


def read_stamp(conn: Connection) -> tuple[str, int]:
    """(identity, version) of the catalog, read together."""
    query = sa.select(version_t.c.identity, version_t.c.version).where(version_t.c.id == 1)
    identity, version = conn.execute(query).one()
    return str(identity), int(version)


def read_state(conn: Connection) -> CatalogState:
    identity, version = read_stamp(conn)
    pool_rows = conn.execute(sa.select(pools_t).order_by(pools_t.c.id)).mappings().all()
    pool_names = {row["id"]: row["name"] for row in pool_rows}
    pools = {
        row["name"]: Row(
            row["id"],
            PoolSpec(
                name=row["name"],
                width=row["width"],
                floor=row["floor"],
                ceiling=row["ceiling"],
                controller_kind=row["controller_kind"],
                controller_params=dict(row["controller_params"] or {}),
                metrics_url=row["metrics_url"],
                endpoints=tuple(row["endpoints"] or ()),
                enabled=bool(row["enabled"]),
                previous_names=tuple(row["previous_names"] or ()),
            ),
        )
        for row in pool_rows
    }
    model_rows = conn.execute(sa.select(models_t).order_by(models_t.c.id)).mappings().all()
    model_names = {row["id"]: row["name"] for row in model_rows}
    models = {
        row["name"]: Row(
            row["id"],
            ModelSpec(
                name=row["name"],
                base_url=row["base_url"],
                kind=row["kind"],
                pool=pool_names.get(row["pool_id"]),
                service=row["service"],
                timeout_ms=row["timeout_ms"],
                api_key_env=row["api_key_env"],
                concurrency=row.get("concurrency"),
            ),
        )
        for row in model_rows
    }
    chosen: dict[int, list[str]] = {}
    query = sa.select(candidates_t).order_by(candidates_t.c.workflow_id, candidates_t.c.position)
    for row in conn.execute(query).mappings():
        chosen.setdefault(row["workflow_id"], []).append(model_names[row["model_id"]])
    workflows = {
        row["name"]: Row(
            row["id"],
            WorkflowSpec(
                name=row["name"],
                priority=row["priority"],
                reserve_ms=row["reserve_ms"],
                deadline_ms=row["deadline_ms"],
                candidates=tuple(chosen.get(row["id"], ())),
                failover=row["failover"],
            ),
        )
        for row in conn.execute(sa.select(workflows_t).order_by(workflows_t.c.id)).mappings()
    }
    services = {
        row["name"]: Row(row["id"], ServiceSpec(row["name"], row["max_concurrency"]))
        for row in conn.execute(sa.select(services_t).order_by(services_t.c.id)).mappings()
    }
    return CatalogState(version, identity, pools, models, workflows, services)

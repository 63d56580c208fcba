"""The routing table: the catalog as plain frozen values for the routing layer.

No ORM objects and no connections inside, so one table can be shared by every
thread of a worker and replaced wholesale when the catalog version moves
(:func:`refresh`). Treat the dicts as read-only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sqlalchemy.engine import Engine

from lanes.catalog import controllers, failover
from lanes.catalog.failover import FailoverParams
from lanes.catalog.export import read_catalog
from lanes.catalog.version import CatalogStamp, catalog_stamp
from lanes.priority import Priority


@dataclass(frozen=True)
class PoolInfo:
    id: int  # stable across renames: lane keys are built from it
    name: str
    width: int
    floor: int
    ceiling: int
    controller: dict | list = field(hash=False)  # as in a catalog file: {"kind": ..., **parameters} or a list
    metrics_url: str | None
    enabled: bool
    previous_names: tuple[str, ...]
    # kind -> parameters of every controller in effect ({} when off)
    controllers: dict = field(hash=False, default_factory=dict)
    endpoints: tuple[str, ...] = ()  # the replicas' base URLs ((): the models' base_url)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    base_url: str
    kind: Literal["chat", "embedding"]
    pool: PoolInfo | None  # None: a hosted API, called without a lane
    service: str | None
    timeout_seconds: float
    api_key_env: str | None
    # A hosted model's fleet-wide limit of calls at once (its own lane); None: unbounded.
    concurrency: int | None = None


@dataclass(frozen=True)
class WorkflowRoute:
    name: str
    priority: Priority
    reserve_seconds: float
    default_deadline_seconds: float | None
    candidates: tuple[ModelInfo, ...]  # primary first
    fleet: str | None  # the primary's pool name: the Celery queue the work runs on
    # The failover share's parameters in effect (None: turned off for this workflow).
    failover: FailoverParams | None = field(default=failover.DEFAULTS, hash=False)
    failover_override: dict | None = field(default=None, hash=False)  # as stored (None: the defaults)


@dataclass(frozen=True)
class RoutingTable:
    version: int
    workflows: dict[str, WorkflowRoute] = field(hash=False)
    pools: dict[str, PoolInfo] = field(hash=False)
    models: dict[str, ModelInfo] = field(hash=False)
    services: dict[str, int] = field(hash=False, default_factory=dict)  # name -> concurrency limit
    # Random, drawn anew with every version: (identity, version) names the contents.
    identity: str = ""

    @property
    def stamp(self) -> CatalogStamp:
        return CatalogStamp(self.identity, self.version)


def load_routing(engine: Engine) -> RoutingTable:
    """Read the whole catalog in one snapshot, with the version that goes with it."""
    state = read_catalog(engine)
    pools = {
        name: PoolInfo(
            id=row.id,
            name=name,
            width=row.spec.width,
            floor=row.spec.floor,
            ceiling=row.spec.ceiling,
            controller=controllers.file_form(row.spec.controller_kind, row.spec.controller_params),
            metrics_url=row.spec.metrics_url,
            enabled=row.spec.enabled,
            previous_names=row.spec.previous_names,
            controllers={kind: controllers.filled(dict(row.spec.controller_params.get(kind, {})), kind)
                         for kind in controllers.kinds_of(row.spec.controller_kind)},
            endpoints=row.spec.endpoints,
        )
        for name, row in state.pools.items()
    }
    models = {
        name: ModelInfo(
            name=name,
            base_url=row.spec.base_url,
            kind=row.spec.kind,  # type: ignore[arg-type]
            pool=pools.get(row.spec.pool) if row.spec.pool else None,
            service=row.spec.service,
            timeout_seconds=row.spec.timeout_ms / 1000,
            api_key_env=row.spec.api_key_env,
            concurrency=row.spec.concurrency,
        )
        for name, row in state.models.items()
    }
    workflows = {}
    for name, row in state.workflows.items():
        spec = row.spec
        candidates = tuple(models[model] for model in spec.candidates)
        primary_pool = candidates[0].pool if candidates else None
        workflows[name] = WorkflowRoute(
            name=name,
            priority=Priority.parse(spec.priority),
            reserve_seconds=spec.reserve_ms / 1000,
            default_deadline_seconds=spec.deadline_ms / 1000 if spec.deadline_ms is not None else None,
            candidates=candidates,
            fleet=primary_pool.name if primary_pool else None,
            failover=failover.effective(spec.failover),
            failover_override=spec.failover,
        )
    services = {name: row.spec.limit for name, row in state.services.items()}
    return RoutingTable(state.version, workflows, pools, models, services, identity=state.identity)


def refresh(engine: Engine, table: RoutingTable | None) -> RoutingTable:
    """``table`` itself while the catalog's stamp (identity and version) is
    unchanged, else a fresh load. The version alone can repeat with other contents."""
    if table is not None and catalog_stamp(engine) == table.stamp:
        return table
    return load_routing(engine)

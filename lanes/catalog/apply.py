"""Make the database say what a document says: plan the changes, then write them.

``apply_document`` validates the whole document before opening a transaction,
plans against a snapshot read under the version lock, validates the catalog
the plan would leave (:mod:`lanes.catalog.combined`), and writes every change
plus one version bump in that same transaction: a reader sees all of it or
none. A document equal to the database is a no-op (no write, no bump).

Pools are matched by name, then by ``previous_names``: a pool whose file entry
lists its current name as a previous name is renamed in place, keeping its id
(and so its lane and its models).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Collection, Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from lanes.catalog import combined
from lanes.catalog.document import CatalogDocument, ModelSpec, PoolSpec, validate
from lanes.catalog.engine import database_errors, writing
from lanes.catalog.shown import show
from lanes.catalog.state import (
    CatalogState,
    Row,
    candidates_t,
    models_t,
    pools_t,
    read_state,
    services_t,
    workflows_t,
)
from lanes.catalog.version import bump_version, lock_version
from lanes.errors import CatalogInvalid, InvalidInput, LanesError


class CatalogMoved(LanesError):
    """The catalog changed after the document was derived from it; nothing was written."""


@dataclass(frozen=True)
class Change:
    action: str  # "create" | "update" | "delete"
    kind: str  # "pool" | "model" | "workflow" | "service"
    name: str
    # (field, old, new); for a rename the field is "name" and ``name`` is the new one
    fields: tuple[tuple[str, Any, Any], ...] = ()

    def describe(self) -> str:
        sign = {"create": "+", "update": "~", "delete": "-"}[self.action]
        text = f"{sign} {self.kind} {self.name}"
        if self.action == "update":
            text += ": " + "; ".join(f"{f} {_show(old)} -> {_show(new)}" for f, old, new in self.fields)
        return text


@dataclass(frozen=True)
class ChangeSet:
    changes: tuple[Change, ...]
    version: int  # the catalog version after the apply (unchanged for a dry run or a no-op)
    dry_run: bool
    # A prune that leaves no pool, model or workflow in a catalog that had some.
    leaves_empty: bool = False

    @property
    def empty(self) -> bool:
        return not self.changes

    @property
    def deleted_pools(self) -> list[str]:
        return [c.name for c in self.changes if c.kind == "pool" and c.action == "delete"]

    def lines(self) -> list[str]:
        return [change.describe() for change in self.changes]

    def to_dict(self) -> dict:
        return {
            "dry_run": self.dry_run,
            "version": self.version,
            "changes": [
                {
                    "action": c.action,
                    "kind": c.kind,
                    "name": c.name,
                    "fields": {f: {"old": old, "new": new} for f, old, new in c.fields},
                }
                for c in self.changes
            ],
        }


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    return "none" if value is None else show(value)


def apply_document(
    engine: Engine,
    document: dict,
    *,
    dry_run: bool = False,
    prune: bool = False,
    checked_pool_deletions: Collection[str] | None = None,
    based_on: int | None = None,
) -> ChangeSet:
    """Upsert ``document`` into the catalog. Raises CatalogInvalid before writing anything.

    ``checked_pool_deletions``: the pools a caller checked were safe to prune
    (from a dry run). If the catalog changed meanwhile so that the apply would
    delete another one, nothing is written and the caller is told to look again.

    ``based_on``: the catalog version ``document`` was derived from (an
    export with one change made, as a PATCH does). If another writer moved
    the catalog since, :class:`CatalogMoved` is raised and nothing is
    written, so a stale copy never undoes someone else's change.
    """
    desired = validate(document)
    with database_errors(engine), writing(engine) as conn:
        version = lock_version(conn)
        if based_on is not None and version != based_on:
            raise CatalogMoved(f"the catalog moved from version {based_on} to {version}")
        current = read_state(conn)
        plan = _Plan(current, desired, prune)
        # The combination of the file with what it leaves alone must be valid too.
        for workflow, old, new in combined.check(current, desired, plan.pool_match, prune):
            plan.changes.append(Change("update", "workflow", workflow, (("fleet", old, new),)))
        if checked_pool_deletions is not None:
            deleted = {c.name for c in plan.changes if c.kind == "pool" and c.action == "delete"}
            unchecked = sorted(deleted - set(checked_pool_deletions))
            if unchecked:
                raise InvalidInput(
                    f"the catalog changed while the prune was checked: it would now also remove "
                    f"{', '.join(unchecked)}; run the apply again"
                )
        if plan.changes and not dry_run:
            plan.write(conn)
            version = bump_version(conn)
    return ChangeSet(tuple(plan.changes), version, dry_run, plan.leaves_empty)


class _Plan:
    def __init__(self, current: CatalogState, desired: CatalogDocument, prune: bool) -> None:
        self.current = current
        self.desired = desired
        self.prune = prune
        # desired pool name -> current row it updates (matched by name, else by a previous name)
        self.pool_match = match_pools(current.pools, desired.pools)
        self.changes: list[Change] = []
        self._diff("service", desired.services, current.services.get)
        self._diff("pool", desired.pools, self.pool_match.get)
        self._diff("model", desired.models, current.models.get)
        self._diff("workflow", desired.workflows, current.workflows.get)
        self.leaves_empty = bool(
            prune
            and not (desired.pools or desired.models or desired.workflows)
            and (current.pools or current.models or current.workflows)
        )
        if prune:
            kept_pools = {row.id for row in self.pool_match.values()}
            for kind, rows, keep in (
                ("workflow", current.workflows, {w.name for w in desired.workflows}),
                ("model", current.models, {m.name for m in desired.models}),
                ("pool", current.pools, None),
                ("service", current.services, {s.name for s in desired.services}),
            ):
                for name, row in rows.items():
                    gone = row.id not in kept_pools if keep is None else name not in keep
                    if gone:
                        self.changes.append(Change("delete", kind, name))

    def _diff(self, kind: str, wanted: Iterable, match: Callable[[str], Row | None]) -> None:
        for spec in wanted:
            row = match(spec.name)
            if row is None:
                self.changes.append(Change("create", kind, spec.name))
                continue
            delta = tuple(
                (f.name, getattr(row.spec, f.name), getattr(spec, f.name))
                for f in fields(spec)
                if getattr(row.spec, f.name) != getattr(spec, f.name)
            )
            if delta:
                self.changes.append(Change("update", kind, spec.name, delta))

    # --- writing ---------------------------------------------------------------------

    def write(self, conn: Connection) -> None:
        changed = {(c.kind, c.name) for c in self.changes if c.action != "delete"}
        deleted = [c for c in self.changes if c.action == "delete"]
        # Order matters for the foreign keys: workflows leave first, then the
        # upserts (a kept workflow drops its pruned candidates), then models,
        # then the pools and services nothing refers to any more.
        for change in deleted:
            if change.kind == "workflow":
                row_id = self.current.workflows[change.name].id
                conn.execute(candidates_t.delete().where(candidates_t.c.workflow_id == row_id))
                conn.execute(workflows_t.delete().where(workflows_t.c.id == row_id))
        for service in self.desired.services:
            if ("service", service.name) in changed:
                values = {"name": service.name, "max_concurrency": service.limit}
                _upsert(conn, services_t, self.current.services.get(service.name), values)
        pool_ids = {name: row.id for name, row in self.current.pools.items()}
        for pool in self.desired.pools:
            if ("pool", pool.name) in changed:
                values = _pool_values(pool)
                pool_ids[pool.name] = _upsert(conn, pools_t, self.pool_match.get(pool.name), values)
            elif pool.name in self.pool_match:
                pool_ids[pool.name] = self.pool_match[pool.name].id
        model_ids = {name: row.id for name, row in self.current.models.items()}
        for model in self.desired.models:
            if ("model", model.name) in changed:
                values = _model_values(model, pool_ids)
                model_ids[model.name] = _upsert(conn, models_t, self.current.models.get(model.name), values)
        for workflow in self.desired.workflows:
            if ("workflow", workflow.name) not in changed:
                continue
            row = self.current.workflows.get(workflow.name)
            values = {
                "name": workflow.name,
                "priority": workflow.priority,
                "reserve_ms": workflow.reserve_ms,
                "deadline_ms": workflow.deadline_ms,
                "failover": workflow.failover,
            }
            workflow_id = _upsert(conn, workflows_t, row, values)
            if row is None or row.spec.candidates != workflow.candidates:
                conn.execute(candidates_t.delete().where(candidates_t.c.workflow_id == workflow_id))
                conn.execute(
                    candidates_t.insert(),
                    [
                        {"workflow_id": workflow_id, "position": position, "model_id": model_ids[name]}
                        for position, name in enumerate(workflow.candidates)
                    ],
                )
        for change in deleted:
            if change.kind == "model":
                conn.execute(models_t.delete().where(models_t.c.id == self.current.models[change.name].id))
        for change in deleted:
            if change.kind == "pool":
                conn.execute(pools_t.delete().where(pools_t.c.id == self.current.pools[change.name].id))
            elif change.kind == "service":
                conn.execute(services_t.delete().where(services_t.c.id == self.current.services[change.name].id))


def match_pools(current: dict[str, Row[PoolSpec]], desired: Iterable[PoolSpec]) -> dict[str, Row[PoolSpec]]:
    """Which current row each file pool updates; a pool with no row is created.

    A current name always wins: a file pool whose name exists updates that
    row, even if another file pool lists the name as a previous one (the name
    was freed by a rename and given to a new pool). Only then does a pool
    not found by name take the row of its newest previous name that no other
    file pool holds. Two file pools claiming the same row that way are
    ambiguous and refused. Linear in the number of pools.
    """
    desired = list(desired)
    match: dict[str, Row[PoolSpec]] = {}
    claimed: dict[int, int] = {}  # row id -> index of the file pool holding it
    for index, pool in enumerate(desired):
        row = current.get(pool.name)
        if row is not None:
            match[pool.name] = row
            claimed[row.id] = index
    problems = []
    for index, pool in enumerate(desired):
        if pool.name in match:
            continue
        for old in reversed(pool.previous_names):
            row = current.get(old)
            if row is None:
                continue
            if row.id in claimed:
                holder = desired[claimed[row.id]]
                if holder.name != old:  # both are renames of the same pool
                    problems.append(
                        f"pools[{index}].previous_names: {old!r} is also renamed by pools[{claimed[row.id]}] "
                        f"({holder.name!r}); only one pool can take its place"
                    )
                continue
            match[pool.name] = row
            claimed[row.id] = index
            break
    if problems:
        raise CatalogInvalid(problems)
    return match


def _upsert(conn: Connection, table: sa.Table, row: Row | None, values: dict) -> int:
    if row is None:
        return int(conn.execute(table.insert().values(**values).returning(table.c.id)).scalar_one())
    conn.execute(table.update().where(table.c.id == row.id).values(**values))
    return row.id


def _pool_values(pool: PoolSpec) -> dict:
    return {
        "name": pool.name,
        "width": pool.width,
        "floor": pool.floor,
        "ceiling": pool.ceiling,
        "controller_kind": pool.controller_kind,
        "controller_params": dict(pool.controller_params),
        "metrics_url": pool.metrics_url,
        "endpoints": list(pool.endpoints),
        "enabled": pool.enabled,
        "previous_names": list(pool.previous_names),
    }


def _model_values(model: ModelSpec, pool_ids: dict[str, int]) -> dict:
    return {
        "name": model.name,
        "base_url": model.base_url,
        "kind": model.kind,
        "pool_id": pool_ids[model.pool] if model.pool is not None else None,
        "service": model.service,
        "timeout_ms": model.timeout_ms,
        "api_key_env": model.api_key_env,
        "concurrency": model.concurrency,
    }


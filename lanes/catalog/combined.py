"""The catalog an apply would leave, checked as a whole.

A file is validated on its own first (every reference inside the file). Two
files that are each valid can still disagree: the second, applied without
``--prune``, turns a model the first file's workflow uses into an embedding
model, or shortens its timeout below that workflow's failover budget. So an
apply also validates the catalog that would result (the file's items over the
rows it leaves alone) and refuses every problem the combination has that the
catalog did not have already, naming the item already in the catalog and the
items of this file it clashes with.

A problem the catalog had before the apply (written by an older version) is
not this apply's doing and does not block it: an unrelated PATCH still goes
through.

A workflow left alone by the file whose primary model moves to another pool
moves to that pool's fleet; :func:`fleet_moves` reports it as a change.
"""

from __future__ import annotations

import re
from dataclasses import replace

from lanes.catalog.document import CatalogDocument, ModelSpec, PoolSpec, validate
from lanes.catalog.export import to_document
from lanes.catalog.shown import show
from lanes.catalog.state import CatalogState, Row
from lanes.errors import CatalogInvalid

_HEAD = re.compile(r"^(?P<section>pools|models|workflows|services)\[(?P<index>\d+)\]")
_QUOTED = re.compile(r"'([^']*)'")
_KIND = {"pools": "pool", "models": "model", "workflows": "workflow", "services": "service"}


def resulting(
    current: CatalogState, desired: CatalogDocument, pool_match: dict[str, Row[PoolSpec]], prune: bool
) -> tuple[CatalogDocument, set[tuple[str, str]]]:
    """The catalog after the apply, and the (section, name) of the items taken from the catalog."""
    kept: set[tuple[str, str]] = set()
    if prune:
        return desired, kept
    renamed = {row.id: name for name, row in pool_match.items()}
    matched_pools = set(renamed)
    pools = list(desired.pools)
    for name, row in current.pools.items():
        if row.id not in matched_pools:
            pools.append(row.spec)
            kept.add(("pools", name))
    pool_ids = {name: row.id for name, row in current.pools.items()}

    def later(section: str, wanted: tuple, rows: dict, adjust=lambda spec: spec) -> list:
        names = {item.name for item in wanted}
        extra = []
        for name, row in rows.items():
            if name not in names:
                extra.append(adjust(row.spec))
                kept.add((section, name))
        return list(wanted) + extra

    def follow_pool(model: ModelSpec) -> ModelSpec:
        # A model refers to its pool by id: a pool renamed by the file keeps it.
        if model.pool is None:
            return model
        return replace(model, pool=renamed.get(pool_ids.get(model.pool), model.pool))

    return (
        CatalogDocument(
            pools=tuple(pools),
            models=tuple(later("models", desired.models, current.models, follow_pool)),
            workflows=tuple(later("workflows", desired.workflows, current.workflows)),
            services=tuple(later("services", desired.services, current.services)),
        ),
        kept,
    )


def check(
    current: CatalogState, desired: CatalogDocument, pool_match: dict[str, Row[PoolSpec]], prune: bool
) -> list[tuple[str, str | None, str | None]]:
    """Raise :class:`CatalogInvalid` for each problem the apply would bring into the catalog;
    else the fleet moves of the workflows it leaves alone (:func:`fleet_moves`)."""
    after, kept = resulting(current, desired, pool_match, prune)
    if not kept:
        return []  # the file is the whole catalog, and it was validated on its own
    before = {line for line, _ in _problems(current.document())}
    new = [(line, item) for line, item in _problems(after) if line not in before]
    if new:
        from_file = {(section, item.name) for section in _KIND for item in getattr(desired, section)}
        raise CatalogInvalid([_both_sides(line, item, kept, from_file) for line, item in new])
    return fleet_moves(current, after, kept, pool_match)


def _problems(document: CatalogDocument) -> list[tuple[str, tuple[str, str] | None]]:
    """Each problem of ``document`` with its item named instead of numbered (stable across applies)."""
    try:
        validate(to_document(document))
    except CatalogInvalid as exc:
        problems = exc.problems
    else:
        return []
    named = []
    for line in problems:
        found = _HEAD.match(line)
        if found is None:
            named.append((line, None))
            continue
        section = found["section"]
        name = getattr(document, section)[int(found["index"])].name
        named.append((f"{_KIND[section]} {show(name)}{line[found.end():]}", (section, name)))
    return named


def _both_sides(line: str, item, kept: set, from_file: set) -> str:
    if item is not None:
        section, name = item
        label = f"{_KIND[section]} {show(name)}"
        where = " (already in the catalog, not in this file)" if item in kept else " (in this file)"
        line = label + where + line[len(label):]
    head, _, rest = line.partition(": ")
    named = set(_QUOTED.findall(rest))
    clashing = [f"{_KIND[section]} {name!r}" for section, name in sorted(from_file) if name in named]
    with_what = f"this file's {', '.join(clashing)}" if clashing else "this file"
    return (
        f"{head}: {rest}; the catalog would hold this after combining it with {with_what} "
        "(change the file, apply the other item too, or use --prune)"
    )


def fleet_moves(
    current: CatalogState, after: CatalogDocument, kept: set, pool_match: dict[str, Row[PoolSpec]]
) -> list[tuple[str, str | None, str | None]]:
    """(workflow, old fleet, new fleet) for each workflow left alone whose primary moves to another pool.

    A pool renamed in place is the same pool (same id, same lane): not a move.
    """
    row_of = {name: row.id for name, row in current.pools.items() if ("pools", name) in kept}
    row_of.update({name: row.id for name, row in pool_match.items()})
    pool_after = {model.name: model.pool for model in after.models}
    moves = []
    for workflow in after.workflows:
        if ("workflows", workflow.name) not in kept or not workflow.candidates:
            continue
        primary = workflow.candidates[0]
        before = current.models.get(primary)
        old = before.spec.pool if before is not None else None
        old_id = current.pools[old].id if old in current.pools else None
        new = pool_after.get(primary)
        new_id = row_of.get(new) if new is not None else None
        if old_id != new_id or (new is not None and new_id is None):
            moves.append((workflow.name, old, new))
    return moves

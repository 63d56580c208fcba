"""Changing one pool or one workflow in place, with PATCH semantics.

A field left out stays as it is; a field given as ``None`` goes back to the
default a catalog file gets when it leaves the key out (a pool's ``ceiling``
to its width, its ``controller`` to ``off``, a workflow's ``deadline_ms`` to
none); a field with no default (a pool's width, a workflow's candidates)
cannot be cleared. Which fields may be patched is read from the catalog
file's own item types, so a field the catalog gains is patchable the day it
lands, and one it lacks is refused as unknown.

The change is validated exactly as the catalog file is, because it goes
through :func:`lanes.catalog.apply_document` with the whole catalog (exported,
with this one item changed) and the version it was read at: if another writer
moved the catalog in between, the patch is planned again on the new catalog
rather than undoing that change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic_core import PydanticUndefined

from lanes.catalog import ChangeSet, apply_document, load_routing
from lanes.catalog.apply import CatalogMoved
from lanes.catalog.document import PoolIn, WorkflowIn
from lanes.catalog.export import read_catalog, to_document
from lanes.errors import CatalogInvalid, Conflict, InvalidInput, NotFound
from lanes.ops.pools import follow_width

# Names and history stay with `lanes catalog apply`: a rename through a PATCH
# would have to carry previous_names along, which a file says better.
FIXED_FIELDS = frozenset({"name", "previous_names"})
ATTEMPTS = 5


@dataclass(frozen=True)
class Section:
    key: str  # the catalog document's list: "pools" or "workflows"
    noun: str
    item: type  # the file's pydantic item type, whose fields and defaults rule

    @property
    def fields(self) -> list[str]:
        return sorted(set(self.item.model_fields) - FIXED_FIELDS)


POOLS = Section("pools", "pool", PoolIn)
WORKFLOWS = Section("workflows", "workflow", WorkflowIn)


def patch_item(engine, section: Section, name: str, changes: dict[str, Any]) -> ChangeSet:
    """Apply ``changes`` to the ``section`` item called ``name``; the catalog's change set."""
    unknown = sorted(set(changes) - set(section.fields))
    if unknown:
        raise InvalidInput(
            f"{section.noun} field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} cannot be "
            f"changed here (fields: {', '.join(section.fields)})"
        )
    for _ in range(ATTEMPTS):
        state = read_catalog(engine)
        document = to_document(state.document())
        items = document[section.key]
        index = next((i for i, item in enumerate(items) if item["name"] == name), None)
        if index is None:
            known = ", ".join(sorted(item["name"] for item in items)) or "none"
            raise NotFound(f"unknown {section.noun} {name!r} (known: {known})")
        items[index] = _merged(section, items[index], changes)
        try:
            return apply_document(engine, document, based_on=state.version)
        except CatalogMoved:
            continue
        except CatalogInvalid as exc:
            raise CatalogInvalid([_local(p, f"{section.key}[{index}]") for p in exc.problems]) from None
    raise Conflict(f"the catalog kept changing while {section.noun} {name!r} was patched ({ATTEMPTS} tries); "
                   "nothing was written; read it again and send the change again")


def _merged(section: Section, current: dict, changes: dict[str, Any]) -> dict:
    merged = dict(current)
    for field, value in changes.items():
        if value is not None:
            merged[field] = value
            continue
        info = section.item.model_fields[field]
        if info.default is PydanticUndefined and info.default_factory is None:
            raise InvalidInput(f"{section.noun} field {field!r} has no default to restore; give a value instead of null")
        # Left out of the document, the field takes its file default when validated.
        merged.pop(field, None)
    return merged


def _local(problem: str, path: str) -> str:
    """A problem of the patched item without its position in the exported document."""
    return problem[len(path) + 1:] if problem.startswith(path + ".") else problem


def patch_pool(client, name: str, changes: dict[str, Any]) -> tuple[ChangeSet, int]:
    """Patch pool ``name``; the change set and the live lane's width once it follows.

    The live lane goes through the width authority (:mod:`lanes.pools`), so a
    width or controller change reaches it now, not at a worker's next follow.
    """
    changed = patch_item(client.engine, POOLS, name, changes)
    pool = load_routing(client.engine).pools[name]
    return changed, follow_width(client, pool)


def patch_workflow(client, name: str, changes: dict[str, Any]) -> ChangeSet:
    """Patch workflow ``name``; workers pick the change up with the catalog version."""
    return patch_item(client.engine, WORKFLOWS, name, changes)


def item_document(client, section: Section, name: str) -> dict:
    """The ``section`` item called ``name`` in the catalog file's form."""
    document = to_document(read_catalog(client.engine).document())
    for item in document[section.key]:
        if item["name"] == name:
            return item
    raise NotFound(f"unknown {section.noun} {name!r}")

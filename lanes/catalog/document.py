"""The declarative catalog document: validation and its normalised form.

A document is a mapping with four lists: ``pools``, ``models``, ``workflows``,
``services`` (see docs/CATALOG.md). It describes the things it names
completely: every reference (a model's pool, a workflow's candidates) must
resolve inside the same document, so a file read alone says what it does.

:func:`validate` finds every problem, not just the first, and reports each
with its key path and offending value (``pools[2].width: 0 is not a width >=
1``). Each item is checked on its own first (pydantic, strict types: YAML's
``on`` is not a name and ``"4"`` is not a width), then the references between
items; an item that failed the first pass is still known by name, so one typo
does not cascade into a page of "unknown model" lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from lanes.catalog import checks, controllers, failover, files
from lanes.catalog.shown import show
from lanes.errors import CatalogInvalid

SECTIONS = ("pools", "models", "workflows", "services")

Name = Annotated[StrictStr, AfterValidator(checks.name)]
ModelName = Annotated[StrictStr, AfterValidator(checks.model_name)]


class _Item(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class PoolIn(_Item):
    name: Name
    width: Annotated[StrictInt, AfterValidator(checks.at_least(1, "a width"))]
    floor: Annotated[StrictInt, AfterValidator(checks.at_least(1, "a floor"))] = 1
    ceiling: Annotated[StrictInt, AfterValidator(checks.at_least(1, "a ceiling"))] | None = None
    # One controller table, or a list of them (composed by veto).
    controller: dict[str, Any] | list[dict[str, Any]] = Field(default_factory=lambda: {"kind": "off"})
    metrics_url: Annotated[StrictStr, AfterValidator(checks.url)] | None = None
    # The pool's replicas, each an OpenAI base URL (``http://gpu0:8000/v1``): calls
    # go to the one with the least in flight, and each is scraped apart.
    endpoints: Annotated[list[Annotated[StrictStr, AfterValidator(checks.url)]],
                         AfterValidator(checks.distinct("an endpoint"))] = Field(default_factory=list)
    enabled: StrictBool = True
    previous_names: list[Name] = Field(default_factory=list)


class ModelIn(_Item):
    name: ModelName
    base_url: Annotated[StrictStr, AfterValidator(checks.url)]
    kind: Annotated[StrictStr, AfterValidator(checks.one_of(("chat", "embedding"), "a kind"))] = "chat"
    pool: StrictStr | None = None
    service: StrictStr | None = None
    timeout_ms: Annotated[StrictInt, AfterValidator(checks.within(1, 3_600_000, "a timeout_ms"))] = 60_000
    api_key_env: Annotated[StrictStr, AfterValidator(checks.env_name)] | None = None
    # A hosted model's (no pool) fleet-wide limit of calls at once; None: unbounded.
    concurrency: Annotated[StrictInt, AfterValidator(checks.within(1, 1_000_000, "a concurrency"))] | None = None


class WorkflowIn(_Item):
    name: Name
    priority: Annotated[Any, AfterValidator(checks.priority)] = "interactive"
    reserve_ms: Annotated[StrictInt, AfterValidator(checks.at_least(0, "a reserve"))] = 0
    deadline_ms: Annotated[StrictInt, AfterValidator(checks.at_least(1, "a deadline in ms"))] | None = None
    candidates: list[StrictStr]
    # The failover share's override (lanes/catalog/failover.py); None: the defaults.
    failover: Any = None


class ServiceIn(_Item):
    name: Name
    limit: Annotated[StrictInt, AfterValidator(checks.at_least(1, "a limit"))]


ITEM_TYPES: dict[str, type[_Item]] = {
    "pools": PoolIn,
    "models": ModelIn,
    "workflows": WorkflowIn,
    "services": ServiceIn,
}


# --- the normalised, valid document ------------------------------------------------


@dataclass(frozen=True)
class PoolSpec:
    name: str
    width: int
    floor: int
    ceiling: int
    controller_kind: str
    controller_params: dict
    metrics_url: str | None
    enabled: bool
    previous_names: tuple[str, ...]
    endpoints: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelSpec:
    name: str
    base_url: str
    kind: str
    pool: str | None
    service: str | None
    timeout_ms: int
    api_key_env: str | None
    concurrency: int | None = None


@dataclass(frozen=True)
class WorkflowSpec:
    name: str
    priority: str
    reserve_ms: int
    deadline_ms: int | None
    candidates: tuple[str, ...]
    failover: dict | None = None  # the stored override (None: the defaults)


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    limit: int


@dataclass(frozen=True)
class CatalogDocument:
    pools: tuple[PoolSpec, ...]
    models: tuple[ModelSpec, ...]
    workflows: tuple[WorkflowSpec, ...]
    services: tuple[ServiceSpec, ...]


# --- validation --------------------------------------------------------------------


def validate(document: Any) -> CatalogDocument:
    """The normalised document, or :class:`CatalogInvalid` listing every problem."""
    problems: list[str] = []
    if files.too_deep(document):
        # A document that did not come through a file (an API body) is bounded too.
        raise CatalogInvalid([f"(top): nested more than {files.MAX_DEPTH} levels deep; a catalog needs five at most"])
    if not isinstance(document, dict):
        raise CatalogInvalid([f"(top): {checks.show(document)} is not a table of {', '.join(SECTIONS)}"])
    for key in document:
        if key not in SECTIONS:
            problems.append(f"{checks.key_shown(key)}: unknown key (known: {', '.join(SECTIONS)})")
    items: dict[str, list[tuple[int, _Item]]] = {}
    declared: dict[str, set[str]] = {}
    for section in SECTIONS:
        raw = document.get(section, [])
        items[section], declared[section] = [], set()
        if not isinstance(raw, list):
            problems.append(f"{section}: {checks.show(raw)} is not a list")
            continue
        for index, entry in enumerate(raw):
            path = f"{section}[{index}]"
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                declared[section].add(entry["name"])
            try:
                items[section].append((index, ITEM_TYPES[section].model_validate(entry)))
            except ValidationError as exc:
                problems.extend(checks.pydantic_problems(path, exc, ITEM_TYPES[section]))
    problems.extend(_cross_check(items, declared))
    if problems:
        raise CatalogInvalid(sorted(problems, key=_document_order))
    return _normalise(items)


def _document_order(problem: str) -> tuple[int, int]:
    """Sort problems as the file reads: by section, then by item."""
    head = problem.split(":", 1)[0]
    section, _, rest = head.partition("[")
    index = rest.split("]", 1)[0]
    return (SECTIONS.index(section) if section in SECTIONS else -1, int(index) if index.isdigit() else -1)


def _cross_check(items: dict[str, list[tuple[int, _Item]]], declared: dict[str, set[str]]) -> list[str]:
    problems: list[str] = []
    for section in SECTIONS:
        problems.extend(checks.duplicates(section, [(i, item.name) for i, item in items[section]]))

    for i, pool in items["pools"]:
        path = f"pools[{i}]"
        ceiling = pool.ceiling if pool.ceiling is not None else max(pool.width, pool.floor)
        if pool.floor > ceiling:
            problems.append(f"{path}.floor: {pool.floor} is above ceiling {ceiling}")
        elif not pool.floor <= pool.width <= ceiling:
            problems.append(f"{path}.width: {pool.width} is outside floor..ceiling {pool.floor}..{ceiling}")
        problems.extend(checks.controller(f"{path}.controller", pool.controller))
        # previous_names are history and are not checked against each other:
        # a name freed by a rename can be given to a new pool (or renamed
        # again), and the export of such a catalog must re-apply. Which pool a
        # previous name matches is decided when applying (apply.match_pools).

    model_kinds = {item.name: item.kind for _, item in items["models"]}
    model_timeouts = {item.name: item.timeout_ms for _, item in items["models"]}
    for i, model in items["models"]:
        path = f"models[{i}]"
        if model.pool is not None and model.pool not in declared["pools"]:
            problems.append(
                f"{path}.pool: {show(model.pool)} is not a pool in this file{checks.known(declared['pools'])}"
            )
        if model.service is not None and model.service not in declared["services"]:
            problems.append(
                f"{path}.service: {show(model.service)} is not a service in this file"
                f"{checks.known(declared['services'])}"
            )
        if model.concurrency is not None and model.pool is not None:
            problems.append(
                f"{path}.concurrency: {model.concurrency} on model {model.name!r}, which has pool "
                f"{show(model.pool)}; a pooled model's calls at once are its pool's width: drop concurrency "
                "(it limits hosted models, with no pool)"
            )
        if model.service is not None and model.pool is None:
            problems.append(
                f"{path}.pool: missing; model {model.name!r} is served by farm service {show(model.service)}, "
                "so it needs a pool (only hosted APIs, with no service, may have none)"
            )

    for i, workflow in items["workflows"]:
        path = f"workflows[{i}]"
        if not workflow.candidates:
            problems.append(f"{path}.candidates: [] is empty; a workflow needs at least one model")
        if workflow.deadline_ms is not None and workflow.reserve_ms >= workflow.deadline_ms:
            problems.append(
                f"{path}.reserve_ms: {workflow.reserve_ms} leaves the primary no time "
                f"within deadline_ms {workflow.deadline_ms}"
            )
        problems.extend(_failover_problems(path, workflow, model_timeouts))
        first_at: dict[str, int] = {}
        for j, name in enumerate(workflow.candidates):
            where = f"{path}.candidates[{j}]"
            if name in first_at:
                problems.append(f"{where}: {show(name)} is already candidates[{first_at[name]}]")
                continue
            first_at[name] = j
            if name not in declared["models"]:
                problems.append(f"{where}: {show(name)} is not a model in this file{checks.known(declared['models'])}")
            elif j > 0 and name in model_kinds and workflow.candidates[0] in model_kinds:
                primary = workflow.candidates[0]
                if model_kinds[name] != model_kinds[primary]:
                    problems.append(
                        f"{where}: {name!r} is {_a(model_kinds[name])} model but the primary "
                        f"{primary!r} is {_a(model_kinds[primary])} model"
                    )
    return problems


def _failover_problems(path: str, workflow: WorkflowIn, model_timeouts: dict[str, int]) -> list[str]:
    found = [f"{path}.failover{'.' + checks.key_shown(key) if key else ''}: {message}"
             for key, message in failover.problems(workflow.failover)]
    if found or not isinstance(workflow.failover, dict) or not workflow.candidates:
        return found
    params = failover.effective(workflow.failover)
    primary = workflow.candidates[0]
    timeout = model_timeouts.get(primary)
    # An override is explicit: its budget must be one the primary's first-token
    # limit can show. (The defaults on a shorter limit are allowed; such a cut-off
    # call is then an unknown outcome, never a breach.)
    if params is not None and timeout is not None and params.latency_budget_ms > timeout:
        found.append(
            f"{path}.failover.latency_budget_ms: {params.latency_budget_ms} is above the primary {primary!r}'s "
            f"timeout_ms {timeout}; a call is cut off before it could breach (lower the budget or raise the timeout)"
        )
    return found


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _normalise(items: dict[str, list[tuple[int, _Item]]]) -> CatalogDocument:
    pools = []
    for _, pool in items["pools"]:
        kind, params = controllers.stored(pool.controller)
        pools.append(
            PoolSpec(
                name=pool.name,
                width=pool.width,
                floor=pool.floor,
                ceiling=pool.ceiling if pool.ceiling is not None else max(pool.width, pool.floor),
                controller_kind=kind,
                controller_params=params,
                metrics_url=pool.metrics_url,
                enabled=pool.enabled,
                previous_names=tuple(pool.previous_names),
                endpoints=tuple(e.rstrip("/") for e in pool.endpoints),
            )
        )
    return CatalogDocument(
        pools=tuple(pools),
        models=tuple(
            ModelSpec(m.name, m.base_url, m.kind, m.pool, m.service, m.timeout_ms, m.api_key_env, m.concurrency)
            for _, m in items["models"]
        ),
        workflows=tuple(
            WorkflowSpec(w.name, w.priority, w.reserve_ms, w.deadline_ms, tuple(w.candidates),
                         failover.normalise(w.failover))
            for _, w in items["workflows"]
        ),
        services=tuple(ServiceSpec(s.name, s.limit) for _, s in items["services"]),
    )

"""``lanes catalog``: apply, check, show and export the routing catalog."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from lanes.cli.common import emit_json, emit_table, json_option, pass_settings
from lanes.errors import InvalidInput

FORMAT = click.Choice(["toml", "yaml"])


@click.group(name="catalog")
def command() -> None:
    """Apply, show and export the routing catalog (pools, models, workflows, services)."""


@command.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--dry-run", is_flag=True, help="Show the changes without writing them.")
@click.option("--prune", is_flag=True, help="Also delete what the file no longer names.")
@click.option(
    "--force", is_flag=True, help="With --prune: remove pools even with work on them, or every pool."
)
@click.option("--format", "format_", type=FORMAT, help="File format (default: from the suffix).")
@click.option("--if-empty", is_flag=True,
              help="Apply only to a catalog with no pools, models or workflows yet (a stack's first start); "
                   "otherwise change nothing, so changes made since are kept.")
@json_option
@pass_settings
def apply(
    settings, file: Path, dry_run: bool, prune: bool, force: bool, format_: str | None, as_json: bool,
    if_empty: bool = False,
) -> None:
    """Make the catalog say what FILE (TOML or YAML) says.

    Everything is validated first; if anything is wrong, each problem is printed
    with its key path and nothing is written (exit code 2).

    --prune refuses (exit 2, nothing written) to remove a pool whose lane has
    holders or waiters or whose Celery queues hold work, or to leave the
    catalog without pools, models and workflows, unless --force; --dry-run
    shows what would be removed and what is in use.
    """
    from lanes.catalog import apply_document, open_catalog, read_document, validate
    from lanes.cli.prune_check import pools_in_use, refusal

    document = read_document(file, format=format_)
    # Before touching the database at all, not even to create it.
    validate(document)
    engine = open_catalog(settings)
    if if_empty:
        from lanes.catalog.export import read_catalog

        try:
            state = read_catalog(engine)
        except BaseException:
            engine.dispose()
            raise
        held = {"pools": len(state.pools), "models": len(state.models), "workflows": len(state.workflows)}
        if any(held.values()):
            engine.dispose()
            counts = ", ".join(f"{count} {kind}" for kind, count in held.items())
            click.echo(f"the catalog already holds {counts} (version {state.version}); --if-empty leaves it as it is")
            return
    try:
        in_use: dict[str, str] = {}
        checked = None
        if prune:
            plan = apply_document(engine, document, dry_run=True, prune=True)
            checked = plan.deleted_pools
            if checked and not force:
                in_use = pools_in_use(settings, engine, checked)
            problem = refusal(plan, in_use)
            if problem and not force and not dry_run:
                raise InvalidInput(problem)
        changes = apply_document(
            engine, document, dry_run=dry_run, prune=prune, checked_pool_deletions=checked
        )
    finally:
        engine.dispose()
    if as_json:
        emit_json({**changes.to_dict(), "in_use": in_use, "leaves_empty": changes.leaves_empty,
                   "warnings": _fail_closed(settings, document)})
        return
    for change in changes.changes:
        note = in_use.get(change.name) if change.kind == "pool" and change.action == "delete" else None
        click.echo(change.describe() + (f"  (in use: {note})" if note else ""))
    if dry_run and prune and (in_use or changes.leaves_empty) and not force:
        click.echo(f"dry run: {refusal(changes, in_use)}")
    if changes.empty:
        click.echo(f"no changes; catalog version {changes.version}")
    elif dry_run:
        click.echo(f"dry run: {len(changes.changes)} change(s) not written")
    else:
        click.echo(f"applied {len(changes.changes)} change(s); catalog version {changes.version}")
    for line in _fail_closed(settings, document):
        click.echo(f"warning: {line}", err=True)


def _fail_closed(settings, document) -> list[str]:
    """Pools whose controllers would fail closed on workers started with these settings."""
    from lanes.catalog import validate
    from lanes.catalog.controllers import kinds_of
    from lanes.catalog.routing import PoolInfo, RoutingTable
    from lanes.control.loop import fail_closed_warnings

    pools = {}
    for i, pool in enumerate(validate(document).pools):
        kinds = {k: pool.controller_params.get(k, {}) for k in kinds_of(pool.controller_kind)}
        pools[pool.name] = PoolInfo(id=i, name=pool.name, width=pool.width, floor=pool.floor, ceiling=pool.ceiling,
                                    controller={}, metrics_url=pool.metrics_url, enabled=pool.enabled,
                                    previous_names=(), controllers=kinds)
    return fail_closed_warnings(settings, RoutingTable(0, {}, pools, {}))


@command.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--format", "format_", type=FORMAT, help="File format (default: from the suffix).")
def check(file: Path, format_: str | None) -> None:
    """Validate FILE without a database."""
    from lanes.catalog import read_document, validate

    catalog = validate(read_document(file, format=format_))
    click.echo(
        f"{file}: valid ({len(catalog.pools)} pools, {len(catalog.models)} models, "
        f"{len(catalog.workflows)} workflows, {len(catalog.services)} services)"
    )


@command.command()
@json_option
@pass_settings
def show(settings, as_json: bool) -> None:
    """Print the catalog: pools, models, workflows and services."""
    from lanes.catalog import load_routing, open_catalog

    engine = open_catalog(settings, create=False)
    try:
        table = load_routing(engine)
    finally:
        engine.dispose()
    if as_json:
        emit_json(_as_json(table))
        return
    # Five narrow columns per table, so names survive an 80-column terminal;
    # --json has every field.
    emit_table(
        f"pools (catalog version {table.version})",
        ["id", "name", "width (floor..ceiling)", "controller", "previously"],
        [
            (p.id, p.name + ("" if p.enabled else " (disabled)"), f"{p.width} ({p.floor}..{p.ceiling})",
             _controller(p.controller), ", ".join(p.previous_names))
            for p in table.pools.values()
        ],
    )
    emit_table(
        "models",
        ["name", "kind", "pool", "service", "timeout"],
        [
            (m.name, m.kind, m.pool.name if m.pool else "(hosted)", m.service, f"{m.timeout_seconds:g}s")
            for m in table.models.values()
        ],
    )
    emit_table(
        "workflows (fleet = the primary's pool)",
        ["name", "priority", "reserve", "deadline", "candidates, primary first", "failover"],
        [
            (w.name, w.priority.label, f"{w.reserve_seconds:g}s",
             f"{w.default_deadline_seconds:g}s" if w.default_deadline_seconds is not None else "-",
             ", ".join(m.name for m in w.candidates), _failover(w))
            for w in table.workflows.values()
        ],
        prose=("candidates, primary first", "failover"), drop_order=("failover",),
    )
    emit_table("services", ["name", "limit"], sorted(table.services.items()))


@command.command()
@click.option("--format", "format_", type=FORMAT, default="toml", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here, not to stdout.")
@pass_settings
def export(settings, format_: str, output: Path | None) -> None:
    """Print the catalog as a file that `lanes catalog apply` accepts (re-applying it changes nothing)."""
    from lanes.catalog import dump, export_document, open_catalog

    engine = open_catalog(settings, create=False)
    try:
        text = dump(export_document(engine), format_)
    finally:
        engine.dispose()
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")
        click.echo(f"wrote {output}", err=True)


def _controller(controller: dict | list) -> str:
    def one(entry: dict) -> str:
        params = ", ".join(f"{k}={v}" for k, v in entry.items() if k != "kind")
        return entry["kind"] + (f" ({params})" if params else "")

    return " + ".join(one(entry) for entry in (controller if isinstance(controller, list) else [controller]))


def _failover(route) -> str:
    """The failover share's setting: off, the defaults, or the override's members."""
    if route.failover is None:
        return "off"
    if not route.failover_override:
        return "defaults"
    return ", ".join(f"{k}={v}" for k, v in route.failover_override.items())


def _as_json(table) -> dict:
    def pool(p):
        return None if p is None else p.name

    return {
        "version": table.version,
        "pools": [
            {"id": p.id, "name": p.name, "width": p.width, "floor": p.floor, "ceiling": p.ceiling,
             "controller": p.controller, "metrics_url": p.metrics_url, "enabled": p.enabled,
             "previous_names": list(p.previous_names)}
            for p in table.pools.values()
        ],
        "models": [
            {"name": m.name, "base_url": m.base_url, "kind": m.kind, "pool": pool(m.pool), "service": m.service,
             "timeout_seconds": m.timeout_seconds, "api_key_env": m.api_key_env}
            for m in table.models.values()
        ],
        "workflows": [
            {"name": w.name, "priority": w.priority.label, "reserve_seconds": w.reserve_seconds,
             "default_deadline_seconds": w.default_deadline_seconds, "fleet": w.fleet,
             "candidates": [m.name for m in w.candidates], "failover": w.failover_override,
             "failover_enabled": w.failover is not None}
            for w in table.workflows.values()
        ],
        "services": [{"name": name, "limit": limit} for name, limit in table.services.items()],
    }

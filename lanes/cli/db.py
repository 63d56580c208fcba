"""``lanes db``: create and migrate the catalog database (Alembic underneath).

Revisions live on two branches: ``schema`` (the tables; what a bare
``lanes db upgrade`` applies) and ``fleet`` (the reference fleet, opt-in:
``lanes db upgrade fleet@head``). See docs/CATALOG.md.
"""

from __future__ import annotations

import click

from lanes.cli.common import emit_json, emit_table, json_option, pass_settings


@click.group(name="db")
def command() -> None:
    """Create and migrate the catalog database (SQLite under the state dir unless LANES_DATABASE_URL is set)."""


# "-1" and "+1" are revisions, not options.
RELATIVE = {"ignore_unknown_options": True}


@command.command(context_settings=RELATIVE)
@click.argument("revision", required=False)
@pass_settings
def upgrade(settings, revision: str | None) -> None:
    """Upgrade to REVISION (e.g. fleet@head, heads, fleet_0002).

    Without REVISION: the schema's head, plus the head of every opt-in branch
    (fleet) the database already follows.
    """
    from lanes.catalog import make_engine, migrate

    url = settings.catalog_url()
    if revision is None:
        engine = make_engine(url)
        try:
            targets = migrate.default_targets(engine) if _has_version_table(engine) else [migrate.SCHEMA_HEAD]
        finally:
            engine.dispose()
    else:
        targets = migrate.upgrade_targets(revision)
    for target in targets:
        migrate.upgrade(url, target, progress=click.echo)
    _print_state(url)


@command.command(context_settings=RELATIVE)
@click.argument("revision")
@click.option("--dry-run", is_flag=True, help="Show the steps and the edits they would overwrite; change nothing.")
@pass_settings
def downgrade(settings, revision: str, dry_run: bool) -> None:
    """Downgrade to REVISION (e.g. fleet@base to drop the reference fleet, base
    for nothing at all, -1 for one step).

    A data revision restores or deletes the rows it wrote; rows edited after
    its upgrade are listed before they are overwritten.
    """
    from lanes.catalog import migrate

    url = settings.catalog_url()
    if dry_run:
        migrate.downgrade(url, revision, progress=lambda line: click.echo(f"dry run: {line}"), dry_run=True)
        click.echo("dry run: nothing was changed")
        return
    migrate.downgrade(url, revision, progress=click.echo)
    _print_state(url)


@command.command()
@json_option
@pass_settings
def current(settings, as_json: bool) -> None:
    """Where each branch of the database stands."""
    from lanes.catalog import make_engine, migrate

    url = settings.catalog_url()
    if settings.database_url is None and not settings.sqlite_path.exists():
        states = None
    else:
        engine = make_engine(url)
        try:
            states = migrate.branch_states(engine)
        finally:
            engine.dispose()
    if as_json:
        emit_json(
            {
                "database": _masked(url),
                "branches": [
                    {"branch": s.branch, "revision": s.revision, "head": s.head, "at_head": s.at_head}
                    for s in states or []
                ],
            }
        )
        return
    if states is None:
        click.echo(f"no catalog yet at {settings.sqlite_path} (any catalog command, or `lanes db upgrade`, creates it)")
        return
    emit_table(
        _masked(url),
        ["branch", "revision", "head", "state"],
        [(s.branch, s.revision or "-", s.head, _describe(s)) for s in states],
    )


@command.command()
@json_option
def history(as_json: bool) -> None:
    """Every revision shipped, oldest first, with its branch."""
    from lanes.catalog import migrate

    revisions = migrate.all_revisions()
    if as_json:
        emit_json([r.__dict__ for r in revisions])
        return
    emit_table(
        "revisions",
        ["revision", "branch", "head", "what it does"],
        [(r.revision, ", ".join(r.branches), "yes" if r.is_head else "", r.doc) for r in revisions],
        prose=["what it does"],
    )


def _describe(state) -> str:
    if state.revision is None:
        return "not applied" if state.branch == "schema" else f"opt-in: lanes db upgrade {state.branch}@head"
    return "at head" if state.at_head else "behind: lanes db upgrade"


def _print_state(url: str) -> None:
    from lanes.catalog import make_engine, migrate

    engine = make_engine(url)
    try:
        states = migrate.branch_states(engine)
    finally:
        engine.dispose()
    for state in states:
        click.echo(f"{state.branch}: {state.revision or '-'} ({_describe(state)})")


def _has_version_table(engine) -> bool:
    from lanes.catalog import migrate

    return "alembic_version" in migrate.table_names(engine)


def _masked(url: str) -> str:
    from lanes.settings import mask_url

    return mask_url(url) or ""

"""``lanes pools``: every pool's live lane, and resizing one."""

from __future__ import annotations

import click

from lanes.cli.common import emit_json, emit_table, json_option, pass_settings
from lanes.ops.lane_stats import queued_text
from lanes.priority import Priority


@click.group(name="pools", invoke_without_command=True)
@json_option
@click.pass_context
def command(ctx, as_json) -> None:
    """Live lane statistics of every pool (width, in flight, queued, holds, waits)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(show, as_json=as_json)


@command.command()
@json_option
@pass_settings
def show(settings, as_json) -> None:
    """Show every pool's lane as all workers see it, and each fleet's live workers."""
    from lanes.ops.pools import pool_reports
    from lanes.routing.client import LanesClient

    client = LanesClient(settings)
    try:
        rows, warning = pool_reports(client)
    finally:
        client.close()
    if warning:
        click.echo(f"warning: {warning}", err=True)
    if as_json:
        emit_json(rows)
        return
    emit_table(
        "lanes",
        ["pool", "width", "in flight", "queued i/u/b (+broker)", "workers", "mean hold ms", "wait p50 ms", "wait p95 ms",
         "grants", "timeouts"],
        [
            [r["pool"], _width_text(r), r["in_flight"],
             queued_text(r),
             "-" if r["live_workers"] is None else len(r["live_workers"]),
             r["mean_hold_ms"], r["wait_p50_ms"], r["wait_p95_ms"], r["grants"], r["timeouts"]]
            for r in rows
        ],
        drop_order=["grants", "timeouts", "mean hold ms", "wait p50 ms", "wait p95 ms"],
    )
    controlled = [r for r in rows if r["controllers"]]
    if controlled:
        emit_table(
            "controllers",
            ["pool", "configured", "width", "floor..ceiling", "controller", "decision", "reason"],
            [
                [r["pool"], r["configured_width"], r["width"], f"{r['floor']}..{r['ceiling']}", kind,
                 _proposal(r, kind)[0], _proposal(r, kind)[1]]
                for r in controlled for kind in sorted(r["controllers"])
            ],
        )
    _fail_closed_lines(rows)


def _fail_closed_lines(rows: list[dict]) -> None:
    """Each pool that fails closed, on lines of its own: a table column would cut the reason."""
    import shutil
    import textwrap

    columns = shutil.get_terminal_size((80, 24)).columns
    for row in rows:
        reason = row.get("fail_closed")
        if reason:
            click.echo(textwrap.fill(f"{row['pool']}: {reason}", width=max(40, columns),
                                     subsequent_indent="  "))


def _width_text(row: dict) -> str:
    """The live width, and the configured one when a controller moved it."""
    if row["width"] == row["configured_width"]:
        return str(row["width"])
    return f"{row['width']} (configured {row['configured_width']})"


def _proposal(row: dict, kind: str) -> tuple[str, str]:
    control = row["control"]
    if control is None:
        return "starting", f"from the configured width {row['configured_width']}"
    proposal = (control.get("proposals") or {}).get(kind)
    if proposal is None:
        return control.get("decision") or "-", control.get("reason") or ""
    return proposal["decision"], proposal["reason"]


@command.command(name="set-width")
@click.argument("name")
@click.argument("width", type=int)
@pass_settings
def set_width(settings, name, width) -> None:
    """Set pool NAME's configured width to WIDTH: in the catalog, and on its live lane at once.

    The live lane goes through the width authority: with the pool's
    controllers off it runs at WIDTH; with a controller on, WIDTH is where
    the controllers start again. Holders are never revoked on a shrink (they
    drain); on a growth waiters are granted immediately.
    """
    from lanes.ops.pools import set_width
    from lanes.routing.client import LanesClient

    client = LanesClient(settings)
    try:
        _, live = set_width(client, name, width)
    finally:
        client.close()
    click.echo(f"pool {name}: width {width}" + (f" (live lane {live})" if live != width else ""))


@command.command()
@pass_settings
def provision(settings) -> None:
    """Create missing lanes at once, skipping their quiet period.

    Only when no worker can hold a slot on them (a new deployment or a new
    Redis). After a Redis restart under load, let the quiet period run instead.
    """
    from lanes.catalog import load_routing
    from lanes.routing.client import LanesClient
    from lanes.routing.runtime import provision_lanes

    client = LanesClient(settings)
    try:
        created = provision_lanes(client.redis, settings, load_routing(client.engine))
    finally:
        client.close()
    click.echo(f"provisioned {len(created)} lane(s){': ' + ', '.join(sorted(created)) if created else ''}")

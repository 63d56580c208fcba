"""``lanes pools``: every pool's live lane, and resizing one."""

from __future__ import annotations

import click

from lanes.catalog import load_routing, open_catalog
from lanes.cli.common import emit_json, emit_table, json_option, live_workers, pass_settings
from lanes.errors import InvalidInput
from lanes.priority import Priority
from lanes.embedded import client_redis_url
from lanes.redis_conn import connect, eviction_warning


def _authority(settings, client):
    from lanes.lane_stats import authority

    return authority(settings, client)


def _lane(settings, client, pool):
    from lanes.lane_stats import live_lane

    return live_lane(settings, client, pool)


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
    from lanes.lane_stats import pool_rows

    table = load_routing(open_catalog(settings, create=False))
    # A fleet is named after its primary pool; other pools have no workers of their own.
    fleets = sorted({route.fleet for route in table.workflows.values() if route.fleet})
    workers = live_workers(settings, fleets)
    client = connect(client_redis_url(settings), timeout=settings.redis_timeout_seconds)
    try:
        warning = eviction_warning(client)
        rows = pool_rows(settings, client, table.pools.values(), workers)
    finally:
        client.close()
    if warning:
        click.echo(f"warning: {warning}", err=True)
    if as_json:
        emit_json(rows)
        return
    emit_table(
        "lanes",
        ["pool", "width", "in flight", "queued i/u/b", "workers", "mean hold ms", "wait p50 ms", "wait p95 ms",
         "grants", "timeouts"],
        [
            [r["pool"], _width_text(r), r["in_flight"],
             "/".join(str(r["queued"][p.label]) for p in Priority),
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
    from lanes.catalog import set_pool_width

    if width < 1:
        raise InvalidInput(f"width {width} is not a width >= 1")
    engine = open_catalog(settings, create=False)
    pool = set_pool_width(engine, name, width)
    client = connect(client_redis_url(settings), timeout=settings.redis_timeout_seconds)
    try:
        lane = _lane(settings, client, pool)
        _authority(settings, client).sync(pool, lane)
        live = lane.stats()
    finally:
        client.close()
    click.echo(f"pool {name}: width {width}" + (f" (live lane {live.width})" if live.exists and live.width != width else ""))


@command.command()
@pass_settings
def provision(settings) -> None:
    """Create missing lanes at once, skipping their quiet period.

    Only when no worker can hold a slot on them (a new deployment or a new
    Redis). After a Redis restart under load, let the quiet period run instead.
    """
    from lanes.routing.runtime import provision_lanes

    table = load_routing(open_catalog(settings, create=False))
    client = connect(client_redis_url(settings), timeout=settings.redis_timeout_seconds)
    try:
        created = provision_lanes(client, settings, table)
    finally:
        client.close()
    click.echo(f"provisioned {len(created)} lane(s){': ' + ', '.join(sorted(created)) if created else ''}")

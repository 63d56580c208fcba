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
    from lanes.control.store import ControlStore
    from lanes.namespace import Namespace
    from lanes.pools import WidthAuthority

    return WidthAuthority(ControlStore(client, Namespace(settings.key_prefix)))


def _lane(settings, client, pool):
    from lanes.pools import pool_lane

    return pool_lane(client, settings, pool, width=lambda: _authority(settings, client).width(pool))


def _ms(seconds) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


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
    from lanes.pools import learned_applies, running_kinds

    table = load_routing(open_catalog(settings, create=False))
    # A fleet is named after its primary pool; other pools have no workers of their own.
    fleets = sorted({route.fleet for route in table.workflows.values() if route.fleet})
    workers = live_workers(settings, fleets)
    client = connect(client_redis_url(settings), timeout=settings.redis_timeout_seconds)
    try:
        warning = eviction_warning(client)
        authority = _authority(settings, client)
        rows = []
        for pool in sorted(table.pools.values(), key=lambda p: p.name):
            stats = _lane(settings, client, pool).stats()
            state = authority.state(pool)
            rows.append({
                "pool": pool.name,
                "configured_width": pool.width,
                "width": stats.width if stats.exists else pool.width,
                "authority_width": authority.width(pool),
                "floor": pool.floor,
                "ceiling": pool.ceiling,
                "controllers": running_kinds(pool),
                # The loop's last decision, each controller's proposal, the signals it read.
                "control": state.as_dict() if learned_applies(pool, state) else None,
                "in_flight": stats.in_flight,
                "queued": {p.label: stats.queued.get(p, 0) for p in Priority},
                "mean_hold_ms": _ms(stats.mean_hold_seconds),
                "wait_p50_ms": _ms(stats.wait_p50_seconds),
                "wait_p95_ms": _ms(stats.wait_p95_seconds),
                "grants": stats.grants,
                "timeouts": stats.timeouts,
                "cancels": stats.cancels,
                "expired": stats.expired,
                # Per priority and workflow with work: holders, waiters, slots still owed (shares).
                "workflows": [share.as_dict() for share in stats.workflows],
                "live_workers": workers.get(pool.name),
            })
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

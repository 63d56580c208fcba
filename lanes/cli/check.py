"""``lanes check``: the lane pools against the farm's services."""

from __future__ import annotations

import sys

import click
import redis

from lanes.catalog import load_routing, open_catalog
from lanes.cli.common import emit_json, json_option, pass_settings
from lanes.control.loop import fail_closed_warnings
from lanes.errors import RedisUnavailable
from lanes.ops.lanecheck import check_lanes
from lanes.redis_conn import connect


@click.command(name="check")
@click.option("--no-redis", is_flag=True, help="Skip the live lane widths (no Redis needed).")
@json_option
@pass_settings
def command(settings, no_redis, as_json) -> None:
    """Print the lane-config report.

    Exit 0: every pool fits its farm services; 1: a mismatch (reported);
    2: an input could not be read (the farm's answer, the catalog); 3: a
    service did not answer (the farm's limits URL, Redis, the database).
    """
    engine = open_catalog(settings, create=False)
    client = None
    try:
        table = load_routing(engine)
        if not no_redis and settings.redis_url:
            client = connect(settings.redis_url, timeout=settings.redis_timeout_seconds)
        report = check_lanes(settings, table, client)
    except redis.RedisError as exc:
        raise RedisUnavailable(f"Redis did not answer while reading lane widths: {exc}") from None
    finally:
        if client is not None:
            client.close()
        engine.dispose()
    if as_json:
        emit_json({**report.as_dict(), "warnings": fail_closed_warnings(settings, table)})
    else:
        click.echo(f"lane config (catalog version {report.catalog_version}, limits from {report.limits_source}):")
        if client is None:
            click.echo("  live lane widths not read (--no-redis, or no LANES_REDIS_URL)")
        if report.ok:
            click.echo("  ok: every pool fits its farm services")
        for mismatch in report.mismatches:
            click.echo(f"  {mismatch.kind}: {mismatch.message}")
        for line in fail_closed_warnings(settings, table):
            click.echo(f"  warning: {line}")
    sys.exit(0 if report.ok else 1)

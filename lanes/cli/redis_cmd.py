"""``lanes redis``: the embedded Redis server of the state directory."""

from __future__ import annotations

import click
import redis

from lanes.cli.common import pass_settings
from lanes.embedded import EmbeddedRedis
from lanes.errors import RedisUnavailable
from lanes.redis_conn import connect


@click.group(name="redis")
def command() -> None:
    """Start, stop and inspect the embedded Redis server (used when LANES_REDIS_URL is unset)."""


@command.command()
@pass_settings
def start(settings) -> None:
    """Start the embedded server (or attach to the running one) and print its URL."""
    if settings.redis_url:
        click.echo(f"LANES_REDIS_URL is set; nothing embedded to start ({settings!r})", err=True)
        return
    click.echo(EmbeddedRedis(settings.state_dir / "redis").ensure())


@command.command()
@pass_settings
def stop(settings) -> None:
    """Stop the embedded server."""
    stopped = EmbeddedRedis(settings.state_dir / "redis").stop()
    click.echo("stopped" if stopped else "not running")


@command.command()
@pass_settings
def status(settings) -> None:
    """Say which state folder and which Redis servers Lanes uses, and whether each is
    safe for its roles: lanes (no eviction), broker and results (no eviction, an
    append-only file). Exit 1 when one is not, 3 when one does not answer."""
    from lanes.embedded import client_redis_url
    from lanes.lane.server import read_config
    from lanes.redis_roles import check_server, servers_of
    from lanes.settings import broker_url_of, describe_state_dir, mask_url, result_url_of

    click.echo(f"state folder: {describe_state_dir(settings)}")
    lanes_url = client_redis_url(settings)
    servers = servers_of(lanes_url, broker_url_of(settings, lanes_url), result_url_of(settings, lanes_url))
    unsafe = silent = False
    for server in servers:
        shown = mask_url(server.url)
        if ";" not in shown:  # one address: without its user; a Sentinel URL's several, masked, whole
            shown = shown.split("@")[-1]
        client = connect(server.url, timeout=settings.redis_timeout_seconds)
        try:
            info = client.info("server")
            config = read_config(client)
        except (redis.RedisError, RedisUnavailable) as exc:
            click.echo(f"{server.label}: Redis at {shown} did not answer: {exc}", err=True)
            silent = True
            continue
        finally:
            client.close()
        click.echo(f"{server.label}: redis {info['redis_version']} at {shown} (run_id {info.get('run_id', '?')})")
        for name, ok, detail in check_server(config, server.roles):
            mark = "ok" if ok else ("unknown (CONFIG not allowed)" if ok is None else "UNSAFE")
            click.echo(f"  {name:<28} {mark}: {detail}")
            unsafe = unsafe or ok is False
    if silent:
        raise SystemExit(3)
    if unsafe:
        click.echo("a Redis is unsafe for its role (see docs/DEPLOYMENT.md, 'Durable queue and results')", err=True)
        raise SystemExit(1)

"""``lanes redis``: the embedded Redis server of the state directory."""

from __future__ import annotations

import click
import redis

from lanes.cli.common import pass_settings
from lanes.embedded import EmbeddedRedis
from lanes.errors import RedisUnavailable
from lanes.redis_conn import connect, lane_redis_checks


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
    """Say which state folder and which Redis Lanes uses, and whether it is safe
    for lanes: no eviction, no persistence (exit 1 when it is not, 3 when it
    does not answer)."""
    from lanes.embedded import client_redis_url
    from lanes.settings import describe_state_dir

    click.echo(f"state folder: {describe_state_dir(settings)}")
    url = client_redis_url(settings)
    client = connect(url, timeout=settings.redis_timeout_seconds)
    try:
        try:
            info = client.info("server")
            checks = lane_redis_checks(client)
        except (redis.RedisError, RedisUnavailable) as exc:
            click.echo(f"Redis at {url.split('@')[-1]} did not answer: {exc}", err=True)
            raise SystemExit(3) from None
        click.echo(f"redis {info['redis_version']} at {url.split('@')[-1]} (run_id {info.get('run_id', '?')})")
        unsafe = False
        for name, ok, detail in checks:
            mark = "ok" if ok else ("unknown (CONFIG not allowed)" if ok is None else "UNSAFE for lanes")
            click.echo(f"  {name:<17} {mark}: {detail}")
            unsafe = unsafe or ok is False
        if unsafe:
            click.echo("this Redis must not hold lanes as configured (see README, 'The lanes' Redis')", err=True)
            raise SystemExit(1)
    finally:
        client.close()

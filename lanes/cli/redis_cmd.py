"""``lanes redis``: the embedded Redis server of the state directory."""

from __future__ import annotations

import click

from lanes.cli.common import pass_settings
from lanes.embedded import EmbeddedRedis
from lanes.redis_conn import connect, eviction_warning


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
    """Say which state folder and which Redis Lanes uses, and whether it is safe for lanes."""
    from lanes.embedded import client_redis_url
    from lanes.settings import describe_state_dir

    click.echo(f"state folder: {describe_state_dir(settings)}")
    url = client_redis_url(settings)
    client = connect(url, timeout=settings.redis_timeout_seconds)
    try:
        info = client.info("server")
        click.echo(f"redis {info['redis_version']} at {url.split('@')[-1]}")
        warning = eviction_warning(client)
        if warning:
            click.echo(f"warning: {warning}", err=True)
    finally:
        client.close()

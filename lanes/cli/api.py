"""``lanes api``: serve the HTTP API with uvicorn."""

from __future__ import annotations

import click

from lanes.cli.common import pass_settings


@click.command(name="api")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every one).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port to listen on (0: any free one, printed at start).")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True)
@pass_settings
def command(settings, host, port, log_level) -> None:
    """Serve the HTTP API: submit and watch tasks, read and change pools, events, health.

    Changes (submit, revoke, PATCH, history) need 'Authorization: Bearer
    TOKEN' with TOKEN from LANES_API_TOKEN; without it set they are refused.
    The OpenAPI document is at /openapi.json, browsable at /docs.
    """
    import uvicorn

    from lanes.api.app import create_app

    if settings.api_token is None:
        click.echo("warning: LANES_API_TOKEN is not set: reads work, every change is refused (403)", err=True)
    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level, access_log=log_level == "debug")

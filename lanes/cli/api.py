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

    Changes need 'Authorization: Bearer TOKEN': LANES_API_TOKEN for all of
    them, LANES_API_SUBMIT_TOKEN for tasks and history only; without a token
    set they are refused. A token shorter than 16 characters, or an example
    file's placeholder, is refused at start.
    The OpenAPI document is at /openapi.json, browsable at /docs.
    """
    import uvicorn

    from lanes.api.app import create_app
    from lanes.errors import InvalidInput
    from lanes.settings import secret_problems

    weak = secret_problems(settings, names=("api_token", "api_submit_token"))
    if weak:
        raise InvalidInput("refusing to serve with a weak token: " + "; ".join(weak))

    if settings.api_token is None:
        click.echo("warning: LANES_API_TOKEN is not set: reads work, every change is refused (403)", err=True)
    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level, access_log=log_level == "debug")

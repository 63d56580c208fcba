"""``lanes result``: a task's answer and routing trace."""

from __future__ import annotations

import click

from lanes.cli.common import emit_json, pass_settings


@click.command(name="result")
@click.argument("task_id")
@pass_settings
def command(settings, task_id) -> None:
    """Print TASK_ID's state, answer or error, and every attempt's routing trace."""
    from lanes.routing.client import LanesClient

    client = LanesClient(settings)
    try:
        emit_json(client.result(task_id))
    finally:
        client.close()

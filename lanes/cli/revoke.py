"""``lanes revoke``: stop a task; a lane wait is cancelled and leaves nothing behind."""

from __future__ import annotations

import click

from lanes.cli.common import emit_json, pass_settings


@click.command(name="revoke")
@click.argument("task_id")
@pass_settings
def command(settings, task_id) -> None:
    """Revoke TASK_ID on every worker and print its report as it stands.

    A queued task is dropped, a lane wait is cancelled at once; a backend
    call already under way runs to its end.
    """
    from lanes.routing.client import LanesClient

    client = LanesClient(settings)
    try:
        emit_json(client.revoke(task_id))
    finally:
        client.close()

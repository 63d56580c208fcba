"""``lanes submit``: send work to a workflow."""

from __future__ import annotations

import json

import click

from lanes.cli.common import emit_json, pass_settings
from lanes.errors import InvalidInput


@click.command(name="submit")
@click.argument("workflow")
@click.option("--payload", required=True, help='The request body as JSON, e.g. \'{"messages": [...]}\'.')
@click.option("--priority", help="interactive, user_tool or background (default: the workflow's).")
@click.option("--deadline", type=float, help="Seconds from now by which the answer is due.")
@click.option("--idempotency-key", help="Repeat submits with this key return the same task.")
@click.option("--wait", is_flag=True, help="Wait for the result and print it.")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="With --wait: how long to wait.")
@pass_settings
def command(settings, workflow, payload, priority, deadline, idempotency_key, wait, timeout) -> None:
    """Submit PAYLOAD to WORKFLOW; print the task id (or, with --wait, the result)."""
    from lanes.routing.client import LanesClient

    try:
        body = json.loads(payload)
    except ValueError as exc:
        raise InvalidInput(f"--payload is not JSON ({exc}): {payload[:80]!r}") from None
    client = LanesClient(settings)
    try:
        result = client.submit(
            workflow, body, priority=priority, deadline=deadline, idempotency_key=idempotency_key
        )
        if not wait:
            click.echo(result.id)
            return
        try:
            result.get(timeout=timeout, propagate=False)
        except Exception as exc:  # celery's TimeoutError
            raise InvalidInput(f"task {result.id} did not finish within {timeout}s; see `lanes result {result.id}`") from exc
        report = client.result(result.id)
        emit_json(report)
        if report["state"] != "SUCCESS":
            raise SystemExit(1)
    finally:
        client.close()

"""``lanes submit``: send work to a workflow."""

from __future__ import annotations

import sys

import click

from lanes.cli.common import emit_json, pass_settings
from lanes.errors import InvalidInput

PAYLOAD_HELP = (
    "The request body as JSON, e.g. '{\"messages\": [...]}'; @FILE reads it from a file, - from stdin."
)


def read_payload(value: str) -> str:
    """The payload text: inline JSON, ``@FILE`` or ``-`` (stdin)."""
    if value == "-":
        return sys.stdin.read()
    if value.startswith("@"):
        path = value[1:]
        if not path:
            raise InvalidInput("--payload @ names no file; write --payload @request.json")
        try:
            with open(path, encoding="utf-8") as handle:
                return handle.read()
        except OSError as exc:
            raise InvalidInput(f"--payload {value}: cannot read {path} ({exc.strerror or exc})") from None
        except UnicodeDecodeError:
            raise InvalidInput(f"--payload {value}: {path} is not UTF-8 text") from None
    return value


@click.command(name="submit")
@click.argument("workflow")
@click.option("--payload", required=True, help=PAYLOAD_HELP)
@click.option("--priority", help="interactive, user_tool or background (default: the workflow's).")
@click.option("--deadline", type=float, help="Seconds from now by which the answer is due.")
@click.option("--idempotency-key", help="Repeat submits of the same request with this key return the same task.")
@click.option("--wait", is_flag=True, help="Wait for the result and print it.")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="With --wait: how long to wait.")
@pass_settings
def command(settings, workflow, payload, priority, deadline, idempotency_key, wait, timeout) -> None:
    """Submit PAYLOAD to WORKFLOW; print the task id (or, with --wait, the result).

    Exit 1 when the task failed, or --wait gave up on it (it stays queued: the
    id is printed, `lanes result ID` shows it later).
    """
    from celery.exceptions import TimeoutError as ResultTimeout

    from lanes.routing.client import LanesClient

    body = read_payload(payload)
    client = LanesClient(settings)
    try:
        result = client.submit(
            workflow, body, priority=priority, deadline=deadline, idempotency_key=idempotency_key
        )
        fleet = client.fleet_of(workflow)
        if not client.live_workers(fleet):
            click.echo(
                f"warning: fleet {fleet!r} has no live worker; the task waits in its queue until one runs "
                f"(`lanes worker --fleet {fleet}`)",
                err=True,
            )
        if not wait:
            click.echo(result.id)
            return
        try:
            result.get(timeout=timeout, propagate=False)
        except ResultTimeout:
            click.echo(result.id)
            click.echo(
                f"error: task {result.id} did not finish within {timeout:g}s; it stays queued: "
                f"see `lanes result {result.id}`",
                err=True,
            )
            raise SystemExit(1) from None
        report = client.result(result.id)
        emit_json(report)
        if report["state"] != "SUCCESS":
            raise SystemExit(1)
    finally:
        client.close()

"""``lanes submit``: send work to a workflow."""

from __future__ import annotations

import sys

import click

from lanes.cli.common import emit_json, pass_settings
from lanes.errors import InvalidInput

PAYLOAD_HELP = (
    "The request body as JSON, e.g. '{\"messages\": [...]}'; @FILE reads it from a file, - from stdin."
)


def file_cap(payload_limit: int) -> int:
    """The most bytes read from a payload file or stdin: room for indentation around a payload at its limit."""
    return payload_limit * 4 + 65_536


def read_payload(value: str, *, payload_limit: int) -> str:
    """The payload text: inline JSON, ``@FILE`` or ``-`` (stdin), read no further than :func:`file_cap`.

    A file over the cap is refused while it is read, never loaded whole
    (a 100 MB file costs at most the cap, not five times its size).
    """
    cap = file_cap(payload_limit)
    if value == "-":
        return _bounded(sys.stdin.buffer, cap, "stdin", value, payload_limit)
    if value.startswith("@"):
        path = value[1:]
        if not path:
            raise InvalidInput("--payload @ names no file; write --payload @request.json")
        try:
            with open(path, "rb") as handle:
                return _bounded(handle, cap, path, value, payload_limit)
        except OSError as exc:
            raise InvalidInput(f"--payload {value}: cannot read {path} ({exc.strerror or exc})") from None
    return value


def _bounded(handle, cap: int, where: str, value: str, payload_limit: int) -> str:
    data = handle.read(cap + 1)
    if len(data) > cap:
        raise InvalidInput(
            f"--payload {value}: {where} holds more than {cap} bytes; a payload may be at most {payload_limit} "
            "bytes as compact JSON (LANES_MAX_PAYLOAD_BYTES); send less"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"--payload {value}: {where} is not UTF-8 text") from None


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
    from lanes.routing.client import LanesClient

    body = read_payload(payload, payload_limit=settings.max_payload_bytes)
    client = LanesClient(settings)
    try:
        result = client.submit(
            workflow, body, priority=priority, deadline=deadline, idempotency_key=idempotency_key
        )
        # The task is queued: from here on nothing may report it as not sent.
        _warn_without_workers(client, workflow)
        if not wait:
            click.echo(result.id)
            return
        report = client.wait(result.id, timeout)
        if report is None:
            click.echo(result.id)
            click.echo(
                f"error: task {result.id} did not finish within {timeout:g}s; it stays queued: "
                f"see `lanes result {result.id}`",
                err=True,
            )
            raise SystemExit(1) from None
        emit_json(report)
        if report["state"] != "SUCCESS":
            raise SystemExit(1)
    finally:
        client.close()


def _warn_without_workers(client, workflow: str) -> None:
    """Warn when the workflow's fleet has no live worker; a check that cannot be made says so."""
    fleet = client.fleet_of(workflow)
    try:
        live = client.live_workers(fleet)
    except Exception as exc:  # the task is queued; a failed look at the workers must not say otherwise
        click.echo(f"warning: could not read fleet {fleet!r}'s workers ({type(exc).__name__}); the task is queued",
                   err=True)
        return
    if not live:
        click.echo(
            f"warning: fleet {fleet!r} has no live worker; the task waits in its queue until one runs "
            f"(`lanes worker --fleet {fleet}`)",
            err=True,
        )

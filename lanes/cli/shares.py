"""``lanes shares``: each workflow's failover share (seed 003), live, and its override."""

from __future__ import annotations

import json
import time

import click

from lanes.catalog import failover, load_routing, open_catalog
from lanes.cli.common import emit_json, emit_table, json_option, pass_settings
from lanes.embedded import client_redis_url
from lanes.errors import InvalidInput
from lanes.redis_conn import connect


@click.group(name="shares", invoke_without_command=True)
@json_option
@click.pass_context
def command(ctx, as_json) -> None:
    """Each workflow's failover share: how often its primary is tried first, and why."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(show, as_json=as_json)


def _setting(route) -> str:
    if route.failover is None:
        return "off"
    if len(route.candidates) < 2:
        return "one candidate"
    return "override" if route.failover_override else "defaults"


@command.command()
@json_option
@pass_settings
def show(settings, as_json) -> None:
    """Every workflow's share as all workers see it (Redis), with the settings in effect."""
    from lanes.namespace import Namespace
    from lanes.routing.share import ShareStore

    table = load_routing(open_catalog(settings, create=False))
    client = connect(client_redis_url(settings), timeout=settings.redis_timeout_seconds)
    try:
        store = ShareStore(client, Namespace(settings.key_prefix))
        states = {name: store.read(name) for name in table.workflows}
    finally:
        client.close()
    rows = []
    for name, route in sorted(table.workflows.items()):
        state = states[name]
        rows.append({
            "workflow": name,
            "setting": _setting(route),
            "override": route.failover_override,
            "params": route.failover.as_dict() if route.failover else None,
            "state": state.as_dict() if state else None,
        })
    if as_json:
        emit_json(rows)
        return
    now = time.time()
    emit_table(
        "failover shares (share = fraction of requests that try the primary first)",
        ["workflow", "setting", "share", "samples", "breach rate", "unknown", "last change"],
        [
            (r["workflow"], r["setting"] + (" (parked)" if r["state"] and r["state"]["parked"] else ""),
             f"{r['state']['share']:.2f}" if r["state"] else ("1.00" if r["params"] else "-"),
             r["state"]["samples"] if r["state"] else "-",
             f"{r['state']['breaches'] / r['state']['samples']:.1%}" if r["state"] and r["state"]["samples"] else "-",
             r["state"]["unknown"] if r["state"] else "-",
             _change(r["state"], now))
            for r in rows
        ],
    )


def _change(state: dict | None, now: float) -> str:
    if not state or not state.get("decision"):
        return "-"
    ago = f", {now - state['changed_at']:.0f}s ago" if state.get("changed_at") else ""
    return state["decision"] + ago


@command.command(name="set")
@click.argument("workflow")
@click.option("--override", "override", metavar="JSON",
              help='Replace the override whole, e.g. \'{"latency_budget_ms": 5000}\'.')
@click.option("--defaults", is_flag=True, help="Drop the override: the defaults apply.")
@click.option("--off", is_flag=True, help='Turn the share off ({"enabled": false}).')
@pass_settings
def set_(settings, workflow, override, defaults, off) -> None:
    """Change one workflow's failover override (PATCH semantics: the admin API's own function)."""
    from lanes.ops.patch import WORKFLOWS, patch_item

    chosen = [flag for flag, on in (("--override", override is not None), ("--defaults", defaults),
                                    ("--off", off)) if on]
    if len(chosen) != 1:
        raise InvalidInput("say exactly one of --override JSON, --defaults or --off"
                           + (f" (got {', '.join(chosen)})" if chosen else ""))
    if off:
        change = {"enabled": False}
    elif defaults:
        change = None
    else:
        try:
            change = json.loads(override)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"--override {override!r} is not JSON ({exc.msg}); "
                               'write e.g. \'{"latency_budget_ms": 5000}\'') from None
    engine = open_catalog(settings, create=False)
    patch_item(engine, WORKFLOWS, workflow, {"failover": change})
    stored = load_routing(engine).workflows[workflow].failover_override
    params = failover.effective(stored)
    click.echo(f"workflow {workflow!r}: failover "
               + ("off" if params is None else "defaults" if stored is None else json.dumps(stored, sort_keys=True)))

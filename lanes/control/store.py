"""A pool controller's state in Redis, shared by every process of the deployment.

One hash per pool (``Namespace.control_state``) holds what any process and
``lanes pools`` may read:

    width, configured, kinds        the learned width, and the configuration it was learned under
    generation                      bumped by every width change; admissions carry it
    admitted                        admissions under the current generation
    overloads, overload_in_flight   overload answers to work of the current generation, and the
                                    lane's in-flight count at the first of them
    completions, served_seconds     served answers (and their call-seconds) not yet consumed by a decision
    background_overloads, stale_overloads, rejections:<status>   counts, never a reason to cut
    decision, reason, controller    the last decision (grow/cut/hold/start), why, and whose
    fail_closed                     why the ceiling is clamped to the configured width ("" when not)
    signals, laws                   JSON: the last signals read, each controller's own memory
    decided_at, changed_at          clock times (seconds)
    fence                           how many leases were ever taken (the fencing number)

The leader writes through ``commit.lua``, which refuses a process whose lease
has passed to another, so two leaders never both write a decision.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources

import redis

from lanes.catalog import PoolInfo
from lanes.catalog.controllers import kinds_text
from lanes.namespace import Namespace

SCRIPTS = ("lease", "commit", "admit", "report")


def _load(name: str) -> str:
    return resources.files("lanes.control").joinpath("scripts", f"{name}.lua").read_text(encoding="utf-8")


@dataclass(frozen=True)
class ControlState:
    width: int | None
    configured: int | None
    kinds: str
    generation: int
    admitted: int = 0
    overloads: int = 0
    overload_in_flight: int | None = None
    completions: int = 0
    served_seconds: float = 0.0
    background_overloads: int = 0
    stale_overloads: int = 0
    decision: str | None = None
    reason: str | None = None
    controller: str | None = None
    signals: dict = field(default_factory=dict)
    laws: dict = field(default_factory=dict)
    decided_at: float | None = None
    changed_at: float | None = None
    rejections: dict = field(default_factory=dict)
    proposals: dict = field(default_factory=dict)
    scrape: dict = field(default_factory=dict)
    leader: str | None = None
    fail_closed: str | None = None  # why the ceiling is clamped to the configured width, or None

    @classmethod
    def parse(cls, raw: dict) -> "ControlState | None":
        fields = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                  for k, v in raw.items()}
        if "generation" not in fields:
            return None

        def number(name, kind=int, default=None):
            value = fields.get(name)
            return default if value in (None, "") else kind(float(value)) if kind is int else kind(value)

        return cls(
            width=number("width"),
            configured=number("configured"),
            kinds=fields.get("kinds", ""),
            generation=number("generation", default=0),
            admitted=number("admitted", default=0),
            overloads=number("overloads", default=0),
            overload_in_flight=number("overload_in_flight"),
            completions=number("completions", default=0),
            served_seconds=number("served_seconds", float, default=0.0),
            background_overloads=number("background_overloads", default=0),
            stale_overloads=number("stale_overloads", default=0),
            decision=fields.get("decision"),
            reason=fields.get("reason"),
            controller=fields.get("controller"),
            signals=json.loads(fields.get("signals") or "{}"),
            laws=json.loads(fields.get("laws") or "{}"),
            decided_at=number("decided_at", float),
            changed_at=number("changed_at", float),
            rejections={k.split(":", 1)[1]: int(v) for k, v in fields.items() if k.startswith("rejections:")},
            proposals=json.loads(fields.get("proposals") or "{}"),
            scrape=json.loads(fields.get("scrape") or "{}"),
            leader=fields.get("leader"),
            fail_closed=fields.get("fail_closed") or None,
        )

    def as_dict(self) -> dict:
        return {
            "width": self.width, "generation": self.generation, "decision": self.decision,
            "reason": self.reason, "controller": self.controller, "signals": self.signals,
            "laws": self.laws, "decided_at": self.decided_at, "changed_at": self.changed_at,
            "admitted": self.admitted, "overloads": self.overloads,
            "background_overloads": self.background_overloads, "stale_overloads": self.stale_overloads,
            "rejections": self.rejections, "proposals": self.proposals, "scrape": self.scrape,
            "leader": self.leader, "fail_closed": self.fail_closed,
        }


def learned_applies(pool: PoolInfo, state: ControlState | None) -> bool:
    """Whether ``state`` was learned under the pool's present configuration."""
    return (
        state is not None
        and state.width is not None
        and state.configured == pool.width
        and state.kinds == kinds_text(pool)
    )


class ControlStore:
    """The Redis side of control: state reads, the lease, commits, admissions and reports."""

    def __init__(self, client: redis.Redis, namespace: Namespace) -> None:
        self.client = client
        self.ns = namespace
        self._scripts = {name: client.register_script(_load(name)) for name in SCRIPTS}

    def _keys(self, pool_id: int) -> list[str]:
        return [self.ns.control_leader(pool_id), self.ns.control_state(pool_id)]

    def read(self, pool_id: int) -> ControlState | None:
        return ControlState.parse(self.client.hgetall(self.ns.control_state(pool_id)))

    def forget(self, pool_id: int) -> None:
        """Drop a pool's learned state (its controllers were turned off or reconfigured)."""
        self.client.hdel(self.ns.control_state(pool_id), *[
            "width", "configured", "kinds", "generation", "admitted", "overloads", "overload_in_flight",
            "completions", "laws", "signals",
        ])

    # --- leadership ----------------------------------------------------------------

    def lease(self, pool_id: int, token: str, ttl_seconds: float) -> str | None:
        """Take or renew the pool's lease: its ``token|fence``, or None when another process holds it."""
        fence = int(self._scripts["lease"](keys=self._keys(pool_id), args=[token, max(1, int(ttl_seconds * 1000))]))
        return f"{token}|{fence}" if fence else None

    def leader(self, pool_id: int) -> str | None:
        value = self.client.get(self.ns.control_leader(pool_id))
        return value.decode() if isinstance(value, bytes) else value

    def resign(self, pool_id: int, lease: str) -> None:
        """Give the lease up at once (a clean shutdown), only if it is still ours."""
        if self.leader(pool_id) == lease:
            self.client.delete(self.ns.control_leader(pool_id))

    def commit(self, pool_id: int, lease: str, fields: dict, *, new_generation: bool, consumed: int = 0,
               consumed_seconds: float = 0.0) -> int | None:
        """Write a decision under ``lease``: the generation now in effect, or None when deposed."""
        args: list = [lease, "1" if new_generation else "0", int(consumed), repr(float(consumed_seconds))]
        for name, value in fields.items():
            args += [name, json.dumps(value) if isinstance(value, (dict, list)) else ("" if value is None else value)]
        generation = int(self._scripts["commit"](keys=self._keys(pool_id), args=args))
        return None if generation < 0 else generation

    # --- what the walkers tell ----------------------------------------------------

    def admit(self, pool_id: int) -> int | None:
        """Count one admission; the generation it is admitted under (None: no controller runs)."""
        reply = self._scripts["admit"](keys=[self.ns.control_state(pool_id)])
        return None if reply is None else int(reply)

    def report(self, pool_id: int, what: str, *, generation: int | None = None, in_flight: int | None = None,
               status: int | None = None, seconds: float = 0.0) -> bool:
        args = [what, "" if generation is None else generation, "" if in_flight is None else in_flight, status or 0,
                repr(float(seconds))]
        return bool(int(self._scripts["report"](keys=[self.ns.control_state(pool_id)], args=args)))

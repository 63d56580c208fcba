"""The three roles a Redis plays for Lanes, and what each needs of its server.

- **lanes** (``LANES_REDIS_URL``): no eviction; persistence allowed (the lanes
  detect a restart and start over, lanes/lane/server.py).
- **broker** (``LANES_BROKER_URL``, default: the lanes' Redis): no eviction
  (an evicted queue loses its messages) and an append-only file, so a restart
  keeps every message ``submit`` acknowledged. ``appendfsync always`` loses
  nothing; ``everysec`` at most the last second before the machine stops dead;
  a snapshot alone (``save``) loses everything since the last one.
- **results** (``LANES_RESULT_URL``, default: the lanes' Redis): the same, so an
  answer stored before its message was acknowledged survives a restart.

One server may play several roles: it is checked once against all of theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

from lanes.lane.server import _value, judge

ROLES = ("lanes", "broker", "results")


@dataclass(frozen=True)
class RoleServer:
    """One Redis address and the roles it plays."""

    url: str
    roles: tuple[str, ...]

    @property
    def label(self) -> str:
        return ", ".join(self.roles)


def servers_of(lanes_url: str, broker_url: str, result_url: str) -> list[RoleServer]:
    """Each distinct address with its roles, in the order lanes, broker, results."""
    by_url: dict[str, list[str]] = {}
    for role, url in zip(ROLES, (lanes_url, broker_url, result_url)):
        by_url.setdefault(url, []).append(role)
    return [RoleServer(url, tuple(roles)) for url, roles in by_url.items()]


def judge_durable(config: dict, roles: tuple[str, ...]) -> list[tuple[str, bool | None, str]]:
    """What a broker or result store needs: no eviction, an append-only file."""
    who = " and ".join(roles)
    policy = _value(config, "maxmemory-policy")
    appendonly = _value(config, "appendonly")
    fsync = _value(config, "appendfsync")
    save = (_value(config, "save") or "").strip()
    out = []
    ok = None if policy is None else policy == "noeviction"
    out.append((f"maxmemory-policy ({who})", ok, f"maxmemory-policy is {policy!r}" + (
        "; set 'maxmemory-policy noeviction' (an evicted message or result is lost work)" if ok is False else "")))
    if appendonly is None:
        out.append((f"persistence ({who})", None, "appendonly not readable (CONFIG not allowed)"))
    elif appendonly == "yes":
        window = {"always": "nothing acknowledged is lost",
                  "everysec": "at most the last second of writes is lost if the machine stops dead",
                  "no": "the operating system decides when writes reach disk (about 30 s at risk)"}
        out.append((f"persistence ({who})", True,
                    f"appendonly yes, appendfsync {fsync}: {window.get(fsync or '', 'see redis.conf')}"))
    else:
        fix = "set 'appendonly yes' and 'appendfsync everysec' (or always)"
        lost = (f"a restart loses everything written since the last snapshot (save {save!r})" if save
                else "a restart loses every queued task and stored result")
        out.append((f"persistence ({who})", False, f"appendonly is {appendonly!r}: {lost}; {fix}"))
    return out


def check_server(config: dict, roles: tuple[str, ...]) -> list[tuple[str, bool | None, str]]:
    """Every requirement of ``roles`` on one server's ``CONFIG GET`` values."""
    checks: list[tuple[str, bool | None, str]] = []
    durable = tuple(role for role in roles if role != "lanes")
    if "lanes" in roles:
        for name, ok, detail in judge(config):
            checks.append((f"{name} (lanes)", ok, detail))
    if durable:
        checks.extend(judge_durable(config, durable))
    return checks

"""The lane-config check: do the lane pools match the farm's services?

The farm's per-service limits come from the catalog's ``services`` table, or
from the JSON endpoint named by ``LANES_FARM_LIMITS_URL`` (``{"services":
{name: limit}}`` or a bare ``{name: limit}``; the simulator serves one at
``/farm/services``). Reported, one :class:`Mismatch` each:

- ``model_without_pool``: a workflow routes to a farm model (one with a
  service, or one the farm lists by name) that has no pool, so nothing
  bounds its load (``lanes catalog apply`` refuses such a model, but a
  catalog edited by hand or a farm that gained a service can still have one);
- ``service_split``: one service's models sit in several pools, so their
  lanes together can send it more than it runs;
- ``pool_over_services``: a pool's configured width is above the sum of its
  services' limits;
- ``pool_under_services``: a narrow lane: the pool can never use what its
  services run at once (its width, or with a controller its ceiling, is
  below the sum), so GPUs idle while work waits in the lane;
- ``controller_over_services``: the live lane width has gone past that sum
  while the configured width had not (a controller's width, or, for a pool
  no controller moves, a width set by hand);
- ``unknown_service``: a pooled model names a service the farm does not list.

Each message's advice fits the pool: a width to set for a pool without a
controller, a ceiling for one with a controller.

A farm answer that cannot be read raises :class:`FarmLimitsUnreadable`
(``lanes check`` exits 2), one that does not come raises
:class:`~lanes.errors.ServiceUnavailable` (exit 3): neither is confused with
a mismatch (exit 1).

Every process checks at its start and when its catalog changes (seed 004):
:func:`check_and_record` is what they call.

A mismatch is an observation, never a failure: :func:`readiness_detail`
reports it and readiness stays green. :class:`MismatchLog` turns successive
reports into one ``lane_config_mismatch`` event when a mismatch appears and
one when it clears.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field

import httpx
import redis
from sqlalchemy.engine import Engine

from lanes.catalog import RoutingTable, record_event
from lanes.errors import InvalidInput, LanesError, ServiceUnavailable
from lanes.namespace import Namespace
from lanes.settings import Settings, mask_url

EVENT_KIND = "lane_config_mismatch"
FARM_TIMEOUT_SECONDS = 5.0
OBSERVE_LOCK_SECONDS = 10

log = logging.getLogger("lanes.lanecheck")


class FarmLimitsUnreadable(InvalidInput):
    """The farm answered, but not with limits this check can read."""


@dataclass(frozen=True)
class Mismatch:
    kind: str
    subject: str  # the model, service or pool it is about
    message: str
    pool: str | None = None
    detail: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.subject}"

    def as_dict(self) -> dict:
        return {**asdict(self), "key": self.key}


@dataclass(frozen=True)
class LaneReport:
    catalog_version: int
    limits_source: str
    mismatches: tuple[Mismatch, ...]
    checked_at: float

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "catalog_version": self.catalog_version,
            "limits_source": self.limits_source,
            "checked_at": self.checked_at,
            "mismatches": [m.as_dict() for m in self.mismatches],
        }


# --- inputs -------------------------------------------------------------------------------


def farm_limits(settings: Settings, table: RoutingTable, *, http: httpx.Client | None = None) -> tuple[dict[str, int], str]:
    """(service -> limit, where it came from)."""
    url = settings.farm_limits_url
    if not url:
        return dict(table.services), "catalog services table"
    own = http is None
    http = http or httpx.Client(timeout=FARM_TIMEOUT_SECONDS)
    try:
        response = http.get(url)
        response.raise_for_status()
        body = response.json()
    except httpx.HTTPStatusError as exc:
        raise ServiceUnavailable(f"farm limits at {mask_url(url)} answered {exc.response.status_code}") from None
    except httpx.HTTPError as exc:
        raise ServiceUnavailable(f"farm limits at {mask_url(url)} did not answer: {exc}") from None
    except ValueError:
        raise FarmLimitsUnreadable(f"farm limits at {mask_url(url)} are not JSON; the farm must answer "
                                   '{"services": {"name": limit}}') from None
    finally:
        if own:
            http.close()
    return parse_limits(body, source=mask_url(url) or url), mask_url(url) or url


def parse_limits(body: object, *, source: str) -> dict[str, int]:
    services = body.get("services", body) if isinstance(body, dict) else None
    if not isinstance(services, dict):
        raise FarmLimitsUnreadable(f"farm limits from {source} must be a JSON object of service -> limit")
    limits = {}
    for name, limit in services.items():
        if isinstance(limit, dict):
            limit = limit.get("max_concurrency", limit.get("limit"))
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise FarmLimitsUnreadable(
                f"farm limit of service {name!r} from {source} is {limit!r}; want an integer >= 1")
        limits[str(name)] = limit
    return limits


def live_widths(client: redis.Redis, settings: Settings, table: RoutingTable) -> dict[str, int]:
    """Each pool's lane width as Redis holds it now (pools whose lane exists)."""
    from lanes.routing.runtime import pool_lane

    widths = {}
    for pool in table.pools.values():
        stats = pool_lane(client, settings, pool).stats()
        if stats.exists:
            widths[pool.name] = stats.width
    return widths


# --- the check -------------------------------------------------------------------------------


def find_mismatches(table: RoutingTable, limits: dict[str, int], widths: dict[str, int]) -> list[Mismatch]:
    """Every mismatch between ``table``'s pools and the farm, in a stable order."""
    found: list[Mismatch] = []
    routed = {model.name for route in table.workflows.values() for model in route.candidates}
    for name in sorted(routed):
        model = table.models[name]
        # A farm model: one with a service, or one the farm lists by its own name.
        service = model.service or (name if name in limits else None)
        if service and model.pool is None:
            found.append(Mismatch(
                "model_without_pool", name,
                f"model {name!r} of farm service {service!r} is routed without a pool; put it in the pool "
                f"of its service so a lane bounds its load",
                detail={"service": service},
            ))
    pools_of_service: dict[str, set[str]] = {}
    services_of_pool: dict[str, set[str]] = {}
    for model in table.models.values():
        if model.service and model.pool is not None:
            pools_of_service.setdefault(model.service, set()).add(model.pool.name)
            services_of_pool.setdefault(model.pool.name, set()).add(model.service)
    for service, pools in sorted(pools_of_service.items()):
        if len(pools) > 1:
            found.append(Mismatch(
                "service_split", service,
                f"service {service!r} is split across pools {', '.join(sorted(pools))}; their lanes together "
                "can exceed what it runs at once: give its models one pool",
                detail={"pools": sorted(pools)},
            ))
        if service not in limits:
            found.append(Mismatch(
                "unknown_service", service,
                f"service {service!r} (pools {', '.join(sorted(pools))}) is not among the farm's services "
                f"({', '.join(sorted(limits)) or 'none'})",
            ))
    for pool_name, services in sorted(services_of_pool.items()):
        known = [s for s in services if s in limits]
        if not known:
            continue
        allowed = sum(limits[s] for s in known)
        found += _width_mismatches(table.pools[pool_name], allowed, sorted(known), widths.get(pool_name))
    return found


def _width_mismatches(pool, allowed: int, services: list[str], live: int | None) -> list[Mismatch]:
    """A pool's widths against what its services run at once, with advice that fits the pool."""
    found = []
    controlled = bool(pool.controllers)
    names = ", ".join(services)
    detail = {"width": pool.width, "allowed": allowed, "services": services, "controlled": controlled,
              "ceiling": pool.ceiling}
    if pool.width > allowed:
        advice = f"set its width to at most {allowed}"
        if controlled and pool.ceiling > allowed:
            advice += f" and its controller's ceiling to {allowed}"
        found.append(Mismatch(
            "pool_over_services", pool.name,
            f"pool {pool.name!r} has width {pool.width} but its services ({names}) run {allowed} at once; {advice}",
            pool=pool.name, detail=detail,
        ))
    reach = pool.ceiling if controlled else pool.width
    if reach < allowed:
        if controlled:
            advice = (f"its controller's ceiling {pool.ceiling} keeps the lane below that: raise the ceiling "
                      f"to {allowed}")
        else:
            advice = f"raise its width to {allowed}"
        found.append(Mismatch(
            "pool_under_services", pool.name,
            f"pool {pool.name!r} is narrower than its services: width {pool.width} but they ({names}) run "
            f"{allowed} at once, so their capacity idles while work waits in the lane; {advice}",
            pool=pool.name, detail=detail,
        ))
    if live is not None and live > allowed >= pool.width:
        if controlled:
            advice = f"cap its controller's ceiling at {allowed}"
        else:
            advice = (f"no controller moves this pool, so the width was set by hand (lanes pools set-width): "
                      f"set it back to {pool.width}")
        found.append(Mismatch(
            "controller_over_services", pool.name,
            f"pool {pool.name!r}'s lane width is {live} (configured {pool.width}) but its services run "
            f"{allowed} at once; {advice}",
            pool=pool.name, detail={**detail, "live_width": live},
        ))
    return found


def check_lanes(settings: Settings, table: RoutingTable, client: redis.Redis | None) -> LaneReport:
    """The whole check: farm limits, live widths (when Redis is given), mismatches."""
    limits, source = farm_limits(settings, table)
    widths = live_widths(client, settings, table) if client is not None else {}
    return LaneReport(table.version, source, tuple(find_mismatches(table, limits, widths)), time.time())


# --- events and readiness -----------------------------------------------------------------------


class MismatchLog:
    """Keeps the last report in Redis; records one event per mismatch appearing and one per clearing."""

    def __init__(self, client: redis.Redis, engine: Engine, *, prefix: str, keep_events: int = 100_000) -> None:
        self.client = client
        self.engine = engine
        self.key = Namespace(prefix).lane_config
        self.keep_events = keep_events

    def previous(self) -> dict | None:
        raw = self.client.get(self.key)
        return json.loads(raw) if raw else None

    def observe(self, report: LaneReport) -> tuple[list[Mismatch], list[dict]]:
        """Record the transitions since the last report; return (appeared, cleared).

        Every process checks at its start: a short Redis lock makes processes
        starting together record each transition once.
        """
        with self.client.lock(f"{self.key}:lock", timeout=OBSERVE_LOCK_SECONDS,
                              blocking_timeout=OBSERVE_LOCK_SECONDS):
            return self._observe(report)

    def _observe(self, report: LaneReport) -> tuple[list[Mismatch], list[dict]]:
        before = {m["key"]: m for m in (self.previous() or {}).get("mismatches", [])}
        now = {m.key: m for m in report.mismatches}
        appeared = [m for key, m in now.items() if key not in before]
        cleared = [m for key, m in before.items() if key not in now]
        for mismatch in appeared:
            record_event(
                self.engine, EVENT_KIND, pool=mismatch.pool, keep=self.keep_events,
                detail={"state": "appeared", "key": mismatch.key, "kind": mismatch.kind,
                        "subject": mismatch.subject, "message": mismatch.message, **mismatch.detail},
            )
        for mismatch in cleared:
            record_event(
                self.engine, EVENT_KIND, pool=mismatch.get("pool"), keep=self.keep_events,
                detail={"state": "cleared", "key": mismatch["key"], "kind": mismatch["kind"],
                        "subject": mismatch["subject"]},
            )
        # Stored after the events: a crash in between repeats an event rather than losing one.
        self.client.set(self.key, json.dumps(report.as_dict()))
        return appeared, cleared


def check_and_record(settings: Settings, engine: Engine, client: redis.Redis, *, where: str,
                     echo=None) -> LaneReport | None:
    """Check the lane config and record its transitions; never raises (a check is an observation).

    ``where`` names the process in the log ("fleet gpu0 start", "memory fleet reload"...).
    """
    from lanes.catalog import load_routing

    say = echo or log.warning
    try:
        report = check_lanes(settings, load_routing(engine), client)
        appeared, cleared = MismatchLog(client, engine, prefix=settings.key_prefix,
                                        keep_events=settings.events_max).observe(report)
    except (LanesError, redis.RedisError, OSError) as exc:
        say(f"lane config ({where}): not checked: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        return None
    for mismatch in appeared:
        say(f"lane config ({where}): {mismatch.message}")
    for mismatch in cleared:
        say(f"lane config ({where}): cleared: {mismatch['message']}")
    return report


def readiness_detail(client: redis.Redis, *, prefix: str) -> dict:
    """The ``lane_config`` readiness detail: the last check's findings.

    Never raises and never makes readiness fail: a mismatch is for people to
    fix, not a reason to take a worker out of service.
    """
    try:
        raw = client.get(Namespace(prefix).lane_config)
    except redis.RedisError as exc:
        return {"ok": None, "fails_readiness": False, "error": f"could not read the last check: {exc}"}
    if not raw:
        return {"ok": None, "fails_readiness": False, "note": "no lane-config check has run yet"}
    report = json.loads(raw)
    return {
        "ok": report["ok"],
        "fails_readiness": False,
        "checked_at": report["checked_at"],
        "catalog_version": report["catalog_version"],
        "mismatches": [m["message"] for m in report["mismatches"]],
    }

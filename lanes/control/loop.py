"""One pool's control decisions, made only by the process holding its lease.

Each tick (at the pool's interval: the shortest ``interval_seconds`` of its
controllers) reads the signals: the lane (width, in flight, waiting), what
the walkers reported to Redis (admissions and overload answers under the
current generation, completions) and, for ``vllm`` and ``utilisation``, a
throttled scrape of the backends' gauges. It asks every controller that is
on, applies the lowest proposal through the lane's resize, and writes the
decision to the pool's state under the lease (a deposed leader's write is
refused). Every change is one ``width_change`` routing event.

Failing closed: a pool whose controllers may go above its configured width
needs a memory gate on the workers (``LANES_MEMORY_GATE_HIGH``). Without one
its ceiling is clamped to the configured width, and the controllers go on
running below it (their cuts still apply). The pool's state says so
(``fail_closed``), and ``lanes pools``, ``lanes top``, Flower, ``lanes
check``, ``catalog apply`` and the API show it.

For a pool that lists its replicas, each scrape also tells the replica
picker (:mod:`lanes.control.replicas`) which replicas answer (a replica
found unreachable is marked down; one that answers is up again) and how
busy each is (the tie-break between equal in-flight counts).
"""

from __future__ import annotations

import logging
from dataclasses import asdict

from lanes.catalog import PoolInfo, RoutingTable
from lanes.catalog.controllers import kinds_text, running_kinds
from lanes.control.laws import Bounds, Composed, Gauges, Signals, compose, wants_reading
from lanes.control.replicas import DOWN_SECONDS, Replicas
from lanes.control.scrape import Scraper, metrics_url
from lanes.control.store import ControlStore, learned_applies
from lanes.instruments import width_changed
from lanes.lane import Lane

log = logging.getLogger("lanes.control")

SCRAPING = ("vllm", "utilisation", "latency")


def memory_gated(settings) -> bool:
    """Whether workers started with ``settings`` have a sensible memory gate (as their runtime decides)."""
    high, low = settings.memory_gate_high, settings.memory_gate_low
    return high is not None and (low is None or low < high)


def fail_closed_warnings(settings, table: RoutingTable) -> list[str]:
    """One line per pool that fails closed on workers with ``settings`` (catalog apply, the API, lanes check)."""
    gated = memory_gated(settings)
    return [f"pool {pool.name}: {reason}" for pool in sorted(table.pools.values(), key=lambda p: p.name)
            if (reason := fail_closed_reason(pool, gated))]


def fail_closed_reason(pool: PoolInfo, memory_gated: bool) -> str | None:
    """Why ``pool``'s ceiling is clamped to its configured width, or None."""
    if running_kinds(pool) and pool.ceiling > pool.width and not memory_gated:
        return (f"fail-closed: ceiling {pool.ceiling} clamped to the configured width {pool.width} "
                "(no memory gate: set LANES_MEMORY_GATE_HIGH on the workers)")
    return None


def _shown(signals: Signals) -> dict:
    """The signals as kept in the pool's state (the latency histograms are left out: bulky)."""
    shown = asdict(signals)
    if shown.get("gauges"):
        shown["gauges"].pop("latency", None)
    return shown


def interval_of(pool: PoolInfo) -> float:
    kinds = running_kinds(pool)
    return min((params.get("interval_seconds", 5.0) for params in kinds.values()), default=5.0)


class ControlLoop:
    def __init__(self, store: ControlStore, events, *, memory_gated: bool, replicas: Replicas | None = None) -> None:
        self.store = store
        self.events = events
        self.memory_gated = memory_gated
        self.replicas = replicas
        self._scrapers: dict[int, Scraper] = {}
        self._next_at: dict[int, float] = {}
        self._warned: set[int] = set()

    def due(self, pool: PoolInfo, now: float) -> bool:
        return now >= self._next_at.get(pool.id, float("-inf"))

    def fails_closed(self, pool: PoolInfo) -> bool:
        """A controller allowed above the configured width needs a memory gate on the workers."""
        return fail_closed_reason(pool, self.memory_gated) is not None

    def tick(self, pool: PoolInfo, table: RoutingTable, lane: Lane, lease: str, now: float) -> Composed | None:
        """One decision for ``pool``; None when there was nothing to decide or the lease was lost."""
        self._next_at[pool.id] = now + interval_of(pool)
        stats = lane.stats()
        if not stats.exists:
            return None  # the lane is coming back from a state loss: nothing to measure yet
        state = self.store.read(pool.id)
        closed = fail_closed_reason(pool, self.memory_gated)
        bounds = Bounds(pool.floor, min(pool.ceiling, pool.width) if closed else pool.ceiling)
        if closed and pool.id not in self._warned:
            self._warned.add(pool.id)
            log.critical("pool %s: %s", pool.name, closed)
        flags = {"fail_closed": closed or ""}
        if not learned_applies(pool, state):
            start = bounds.clamp(pool.width)
            return self._apply(pool, lane, lease, now, stats.width, Composed(
                start, "start", None, f"controllers {kinds_text(pool)} start from the configured width {pool.width}"),
                fields={"configured": pool.width, "kinds": kinds_text(pool), "laws": {}, **flags},
                new_generation=True)
        gauges = self._gauges(pool, table, now, lane_in_flight=stats.in_flight, width=state.width,
                              now_wanted=wants_reading(state.laws))
        scraper = self._scrapers.get(pool.id)
        elapsed = now - state.decided_at if state.decided_at is not None else 0.0
        signals = Signals(
            width=state.width,
            in_flight=stats.in_flight,
            waiting=sum(stats.queued.values()),
            admitted=state.admitted,
            overloads=state.overloads,
            overload_in_flight=state.overload_in_flight,
            completions=state.completions,
            served_concurrency=state.served_seconds / elapsed if elapsed > 0 else None,
            window_seconds=elapsed if elapsed > 0 else None,
            gauges=gauges,
            configured=pool.width,
            width_age_seconds=now - state.changed_at if state.changed_at is not None else None,
            outage_seconds=scraper.outage(now) if scraper is not None else None,
        )
        memos = dict(state.laws)
        composed = compose(running_kinds(pool), signals, bounds, memos)
        if closed and composed.width == bounds.ceiling and composed.decision == "hold":
            composed.reason = f"{composed.reason}; {closed}"
        return self._apply(pool, lane, lease, now, state.width, composed,
                           fields={"laws": memos, "signals": _shown(signals), **flags},
                           consumed=signals.completions, consumed_seconds=state.served_seconds)

    def _gauges(self, pool: PoolInfo, table: RoutingTable, now: float, *, lane_in_flight: int,
                width: int, now_wanted: bool = False) -> Gauges | None:
        """A reading when one is due: every ``scrape_seconds``, or at once while a growth waits
        for a reading to judge it (``now_wanted``: laws.wants_reading)."""
        kinds = running_kinds(pool)
        scraping = [kinds[k] for k in SCRAPING if k in kinds]
        if not scraping:
            return None
        scraper = self._scrapers.setdefault(pool.id, Scraper())
        held = self._held(pool, table, scraper, width)
        every = 0.0 if now_wanted else min(p["scrape_seconds"] for p in scraping)
        gauges = scraper.read(pool, table, now, every=every,
                              timeout=min(p["timeout_seconds"] for p in scraping),
                              stale=min(p.get("stale_seconds", 60.0) for p in scraping), held=held)
        if gauges is not None and pool.endpoints and self.replicas is not None:
            self._tell_replicas(pool, scraper)
        return gauges

    def _held(self, pool: PoolInfo, table: RoutingTable, scraper: Scraper, width: int):
        """The width kept for an endpoint missing from a reading: what the lane has in flight
        there (a replica the picker stopped calling holds nothing), else its even share."""
        if pool.endpoints and self.replicas is not None:
            try:
                counts = self.replicas.in_flight(pool.id)
            except Exception:
                counts = None
            if counts is not None:
                by_url = {metrics_url(e): counts.get(e, 0) for e in pool.endpoints}
                return lambda url: float(by_url.get(url, 0))
        share = width / max(1, len(scraper.urls) or 1)
        return lambda url: share

    def _tell_replicas(self, pool: PoolInfo, scraper: Scraper) -> None:
        endpoints = {metrics_url(e): e for e in pool.endpoints}
        running = {}
        try:
            for url, seen in scraper.endpoints.items():
                endpoint = endpoints.get(url)
                if endpoint is None:
                    continue
                if seen.unreachable:
                    self.replicas.mark_down(pool.id, endpoint, DOWN_SECONDS)
                elif seen.error is None:
                    self.replicas.mark_up(pool.id, endpoint)
                    if seen.reading is not None:
                        running[endpoint] = seen.reading.running
            self.replicas.record_load(pool.id, running)
        except Exception:  # the picker's hints; calls still go out without them
            log.warning("pool %s: could not tell the replica picker what the scrape found", pool.name, exc_info=True)

    def _apply(self, pool: PoolInfo, lane: Lane, lease: str, now: float, old: int, composed: Composed, *,
               fields: dict, new_generation: bool = False, consumed: int = 0,
               consumed_seconds: float = 0.0) -> Composed | None:
        changed = composed.width != old
        record = {
            **fields,
            "width": composed.width,
            "decision": composed.decision,
            "reason": composed.reason,
            "controller": composed.controller or "",
            "proposals": composed.proposals,
            "decided_at": now,
            "leader": lease,
        }
        if pool.id in self._scrapers:
            record["scrape"] = self._scrapers[pool.id].snapshot()
        if changed:
            record["changed_at"] = now
        generation = self.store.commit(pool.id, lease, record, new_generation=changed or new_generation,
                                       consumed=consumed, consumed_seconds=consumed_seconds)
        if generation is None:
            return None  # another process leads now; its decisions stand
        if lane.stats().width != composed.width:
            lane.resize(composed.width)
        if changed:
            width_changed(pool.name, composed.controller or composed.decision, old, composed.width)
            self.events.record("width_change", pool=pool.name, controller=composed.controller or composed.decision,
                               old=old, new=composed.width, reason=composed.reason, generation=generation,
                               leader=lease)
        return composed

    def forget(self, pool_id: int) -> None:
        self._warned.discard(pool_id)
        self._next_at.pop(pool_id, None)
        scraper = self._scrapers.pop(pool_id, None)
        if scraper is not None:
            scraper.close()

    def close(self) -> None:
        for pool_id in list(self._scrapers):
            self.forget(pool_id)


"""One pool's control decisions, made only by the process holding its lease.

Each tick (at the pool's interval: the shortest ``interval_seconds`` of its
controllers) reads the signals: the lane (width, in flight, waiting), what
the walkers reported to Redis (admissions and overload answers under the
current generation, completions) and, for ``vllm`` and ``utilisation``, a
throttled scrape of the backends' gauges. It asks every controller that is
on, applies the lowest proposal through the lane's resize, and writes the
decision to the pool's state under the lease (a deposed leader's write is
refused). Every change is one ``width_change`` routing event.
"""

from __future__ import annotations

import logging
from dataclasses import asdict

from lanes.catalog import PoolInfo, RoutingTable
from lanes.control.laws import Bounds, Composed, Gauges, Signals, compose
from lanes.control.scrape import Scraper
from lanes.control.store import ControlStore
from lanes.lane import Lane
from lanes.metrics import width_changed
from lanes.pools import kinds_text, learned_applies, running_kinds

log = logging.getLogger("lanes.control")

SCRAPING = ("vllm", "utilisation")


def interval_of(pool: PoolInfo) -> float:
    kinds = running_kinds(pool)
    return min((params.get("interval_seconds", 5.0) for params in kinds.values()), default=5.0)


class ControlLoop:
    def __init__(self, store: ControlStore, events, *, memory_gated: bool) -> None:
        self.store = store
        self.events = events
        self.memory_gated = memory_gated
        self._scrapers: dict[int, Scraper] = {}
        self._next_at: dict[int, float] = {}
        self._warned: set[int] = set()

    def due(self, pool: PoolInfo, now: float) -> bool:
        return now >= self._next_at.get(pool.id, float("-inf"))

    def fails_closed(self, pool: PoolInfo) -> bool:
        """A controller allowed above the configured width needs a memory gate on the workers."""
        return pool.ceiling > pool.width and not self.memory_gated

    def tick(self, pool: PoolInfo, table: RoutingTable, lane: Lane, lease: str, now: float) -> Composed | None:
        """One decision for ``pool``; None when there was nothing to decide or the lease was lost."""
        self._next_at[pool.id] = now + interval_of(pool)
        stats = lane.stats()
        if not stats.exists:
            return None  # the lane is coming back from a state loss: nothing to measure yet
        state = self.store.read(pool.id)
        bounds = Bounds(pool.floor, pool.ceiling)
        if not learned_applies(pool, state):
            start = bounds.clamp(pool.width)
            return self._apply(pool, lane, lease, now, stats.width, Composed(
                start, "start", None, f"controllers {kinds_text(pool)} start from the configured width {pool.width}"),
                fields={"configured": pool.width, "kinds": kinds_text(pool), "laws": {}}, new_generation=True)
        if self.fails_closed(pool):
            if pool.id not in self._warned:
                self._warned.add(pool.id)
                log.critical(
                    "pool %s: controllers may raise the width above %d (ceiling %d) but this worker has no memory "
                    "gate (set LANES_MEMORY_GATE_HIGH); running at the configured width", pool.name, pool.width,
                    pool.ceiling)
            return self._apply(pool, lane, lease, now, state.width, Composed(
                pool.width, "fail_closed", None, "no memory gate on the workers: configured width"), fields={})
        gauges = self._gauges(pool, table, now)
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
        )
        memos = dict(state.laws)
        composed = compose(running_kinds(pool), signals, bounds, memos)
        return self._apply(pool, lane, lease, now, state.width, composed,
                           fields={"laws": memos, "signals": asdict(signals)},
                           consumed=signals.completions, consumed_seconds=state.served_seconds)

    def _gauges(self, pool: PoolInfo, table: RoutingTable, now: float) -> Gauges | None:
        kinds = running_kinds(pool)
        scraping = [kinds[k] for k in SCRAPING if k in kinds]
        if not scraping:
            return None
        scraper = self._scrapers.setdefault(pool.id, Scraper())
        params = scraping[0]
        return scraper.read(pool, table, now, every=min(p["scrape_seconds"] for p in scraping),
                            timeout=params["timeout_seconds"], stale=params.get("stale_seconds", 60.0))

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
                               old=old, new=composed.width, reason=composed.reason, generation=generation)
        return composed

    def forget(self, pool_id: int) -> None:
        self._next_at.pop(pool_id, None)
        scraper = self._scrapers.pop(pool_id, None)
        if scraper is not None:
            scraper.close()

    def close(self) -> None:
        for pool_id in list(self._scrapers):
            self.forget(pool_id)


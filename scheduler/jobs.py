"""What the beat runs: the memory tick and the lane-config check.

Both are short database and Redis reads and writes, so the active beat runs
them itself (see :mod:`scheduler.beat`). The memory tick is the memory
feature's own (:func:`lanes.memory.dispatch.memory_tick`): the runs it creates
go to the memory workers as Celery messages.
"""

from __future__ import annotations

import logging
import time

from lanes.catalog import catalog_version, load_routing
from lanes.celery_client import make_celery
from lanes.clock import Clock, SystemClock
from lanes.errors import LanesError
from lanes.memory import open_memory
from lanes.memory.dispatch import memory_tick
from lanes.ops.lanecheck import LaneReport, MismatchLog, check_lanes
from lanes.redis_conn import connect
from lanes.settings import Settings

log = logging.getLogger("lanes.scheduler")


class SchedulerJobs:
    def __init__(self, settings: Settings, redis_url: str, *, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.engine = open_memory(settings)
        self.client = connect(redis_url, timeout=settings.redis_timeout_seconds)
        self.publisher = make_celery(settings, redis_url, main="lanes-beat-publisher")
        self.mismatches = MismatchLog(self.client, self.engine, prefix=settings.key_prefix,
                                      keep_events=settings.events_max)
        self._checked_version: int | None = None
        self._checked_at = float("-inf")

    def memory_tick(self, full: bool = False) -> dict:
        return memory_tick(self.engine, self.publisher, self.settings, client=self.client, now=self.clock.now(),
                           full=full)

    def lane_check(self, force: bool = False) -> LaneReport | None:
        """Check when forced, when the catalog changed, or every ``lane_check_seconds``."""
        version = catalog_version(self.engine)
        due = time.monotonic() - self._checked_at >= self.settings.lane_check_seconds
        if not force and not due and version == self._checked_version:
            return None
        try:
            report = check_lanes(self.settings, load_routing(self.engine), self.client)
        except LanesError as exc:
            # The farm's limits did not answer, or answered nonsense: try again
            # at the next period or catalog change, without a traceback every poll.
            self._checked_version, self._checked_at = version, time.monotonic()
            log.warning("lane config: not checked: %s", exc)
            return None
        appeared, cleared = self.mismatches.observe(report)
        self._checked_version, self._checked_at = report.catalog_version, time.monotonic()
        for mismatch in appeared:
            log.warning("lane config: %s", mismatch.message)
        for mismatch in cleared:
            log.warning("lane config: cleared: %s", mismatch["message"])
        return report

    def close(self) -> None:
        self.publisher.close()
        self.client.close()
        self.engine.dispose()

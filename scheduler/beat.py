"""The beat: one active scheduler fleet-wide, all times UTC.

celery-redbeat keeps the schedule in Redis and holds a Redis lock
(``{prefix}:beat:lock``, renewed at every tick): a second beat started at
once blocks on that lock and takes over only when the first stops renewing it
(it died, or lost Redis), ``beat_lock_seconds`` later. A beat whose renewal
is refused stops.

Schedule:

- ``memory-hourly`` at HH:02: runs for the last two completed hours;
- ``memory-full`` at 03:02: runs for the whole retention window;
- ``lane-check`` every 10 s: a lane-config check when the catalog version
  moved, or every ``lane_check_seconds`` (5 minutes) otherwise;
- at start-up (the first tick after the lock is won): a full memory scan and
  a lane-config check.

The jobs run inside the beat that holds the lock rather than on workers:
they are short scans, and running them where the lock is held means exactly
one copy runs, with no worker queue of their own to keep alive.
"""

from __future__ import annotations

import logging
import os
import socket
import time

from celery import Celery
from celery.schedules import crontab
from redbeat import RedBeatScheduler

from lanes.celery_client import make_celery
from lanes.namespace import Namespace
from lanes.settings import Settings

log = logging.getLogger("lanes.scheduler")

MEMORY_TICK = "lanes.scheduler.memory_tick"
LANE_CHECK = "lanes.scheduler.lane_check"
CATALOG_POLL_SECONDS = 10.0


def beat_schedule(*, nowfun=None) -> dict:
    """The beat's entries; ``nowfun`` injects the time into the crontabs (tests)."""
    extra = {"nowfun": nowfun} if nowfun is not None else {}
    return {
        "memory-hourly": {"task": MEMORY_TICK, "schedule": crontab(minute=2, **extra), "kwargs": {"full": False}},
        "memory-full": {"task": MEMORY_TICK, "schedule": crontab(minute=2, hour=3, **extra), "kwargs": {"full": True}},
        "lane-check": {"task": LANE_CHECK, "schedule": CATALOG_POLL_SECONDS, "kwargs": {}},
    }


def make_beat_app(settings: Settings, redis_url: str) -> Celery:
    names = Namespace(settings.key_prefix)
    app = make_celery(settings, redis_url, main="lanes-beat")
    app.conf.update(
        timezone="UTC",
        enable_utc=True,
        beat_schedule=beat_schedule(),
        redbeat_redis_url=redis_url,
        # Redbeat's own connection: bounded waits, so a beat cut off from
        # Redis stops (and its lock lapses) instead of hanging.
        redbeat_redis_options={
            "socket_timeout": settings.redis_timeout_seconds,
            "socket_connect_timeout": settings.redis_timeout_seconds,
        },
        redbeat_key_prefix=names.beat_prefix,
        redbeat_lock_key=names.beat_lock,
        redbeat_lock_timeout=int(settings.beat_lock_seconds),
        # The lock is renewed every loop: loop well inside its timeout.
        beat_max_loop_interval=max(1.0, settings.beat_lock_seconds / 5),
    )
    return app


class LanesBeatScheduler(RedBeatScheduler):
    """RedBeat's scheduler, running its entries in this process, plus the start-up jobs."""

    def __init__(self, app, *args, **kwargs) -> None:
        super().__init__(app, *args, **kwargs)
        self.jobs = app.lanes_jobs
        self.names = Namespace(app.lanes_settings.key_prefix)
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._started = False

    def _job(self, task: str):
        return {MEMORY_TICK: self.jobs.memory_tick, LANE_CHECK: self.jobs.lane_check}[task]

    def apply_async(self, entry, producer=None, advance=True, **kwargs):
        entry = self.reserve(entry) if advance else entry
        self._run(entry.task, **(entry.kwargs or {}))
        return None

    def _run(self, task: str, **kwargs) -> None:
        try:
            self._job(task)(**kwargs)
        except Exception:
            # One failed run of a job must not stop the beat: the next tick tries again.
            log.exception("beat job %s failed", task)

    def tick(self, *args, **kwargs):
        # The lock was won in beat_init, before the first tick: only the
        # active beat gets here.
        if not self._started:
            self._started = True
            self._mark_active()
            log.info("beat %s active: start-up scan and lane check", self.owner)
            self._run(MEMORY_TICK, full=True)
            self._run(LANE_CHECK, force=True)
        interval = super().tick(*args, **kwargs)
        self._mark_active()
        return interval

    def _mark_active(self) -> None:
        client = self.jobs.client
        key = self.names.beat_active
        with client.pipeline() as pipe:
            pipe.hsetnx(key, "since", time.time())
            pipe.hset(key, mapping={"owner": self.owner, "seen": time.time()})
            pipe.expire(key, int(self.lock_timeout))
            pipe.execute()

    def close(self) -> None:
        try:
            if self.lock is not None and self.lock.owned():
                self.jobs.client.delete(self.names.beat_active)
        finally:
            super().close()

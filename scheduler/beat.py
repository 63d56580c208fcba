"""The beat: one active scheduler fleet-wide, all times UTC.

celery-redbeat keeps the schedule in Redis; which beat is active is decided
by a Redis lock (``{prefix}:beat:lock``) that :class:`scheduler.role.BeatRole`
requests once per loop, without blocking: the holder renews it, the others
ask for it and stay standbys while it is held. A holder that stops renewing
(it died, was paused, or lost Redis) loses it ``beat_lock_seconds`` later
and a standby takes over. A Redis outage ends no beat: each one stands by
while Redis is away and asks again every loop, so the schedule comes back
on its own when Redis does (with the former holder, when its lock survived).

Schedule:

- ``memory-hourly`` at HH:02: runs for the last two completed hours;
- ``memory-full`` at 03:02: runs for the whole retention window;
- ``lane-check`` every 10 s: a lane-config check when the catalog version
  moved, or every ``lane_check_seconds`` (5 minutes) otherwise;
- each time a beat becomes active: a full memory scan (it also reclaims
  orphaned runs and sends every run without a message) and a lane check.

Every beat, standby or not, also checks the lane config once at its start
(seed 004: each process checks at start and on reload).

The jobs run inside the beat that holds the lock rather than on workers:
they are short scans, and running them where the lock is held means exactly
one copy runs, with no worker queue of their own to keep alive.
"""

from __future__ import annotations

import logging
import os
import socket
import time

import redis
from celery import Celery
from celery.schedules import crontab
from kombu.exceptions import OperationalError
from redbeat import RedBeatScheduler

from lanes.celery_client import make_celery
from lanes.errors import LanesError
from lanes.namespace import Namespace
from lanes.redis_conn import connect
from lanes.settings import Settings
from scheduler.role import BeatRole

log = logging.getLogger("lanes.scheduler")

MEMORY_TICK = "lanes.scheduler.memory_tick"
LANE_CHECK = "lanes.scheduler.lane_check"
CATALOG_POLL_SECONDS = 10.0
# Errors that mean "Redis did not answer": the beat stands by and asks again.
REDIS_DOWN = (redis.RedisError, OperationalError, OSError)
# Entries polled so often that announcing each run would flood the log.
QUIET_ENTRIES = ("lane-check",)


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
    """RedBeat's scheduler, running its entries in this process, active only while its lock request succeeds."""

    def __init__(self, app, *args, **kwargs) -> None:
        self.jobs = app.lanes_jobs
        settings = app.lanes_settings
        self.names = Namespace(settings.key_prefix)
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._schedule_ready = False
        self._checked_at_start = False
        self._was_active = False
        super().__init__(app, *args, **kwargs)
        # The lock is ours to manage (scheduler.role), not redbeat's: without
        # a lock key its start-up handler never blocks on the lock and its
        # tick never renews one.
        self.role = BeatRole(
            connect(app.conf.redbeat_redis_url, timeout=settings.redis_timeout_seconds),
            key=self.lock_key, timeout_seconds=float(self.lock_timeout), owner=self.owner,
        )
        self.lock_key = None

    def setup_schedule(self):
        try:
            super().setup_schedule()
            self._schedule_ready = True
        except REDIS_DOWN as exc:
            # Redis is away at start-up: the first tick that finds it sets the schedule up.
            log.warning("beat %s: could not store the schedule yet: %s", self.owner, exc)

    @property
    def _maybe_due_kwargs(self) -> dict:
        # The jobs run here: no broker producer, whose first connection would
        # retry for ever if it were made while Redis is away.
        return {}

    def _job(self, task: str):
        return {MEMORY_TICK: self.jobs.memory_tick, LANE_CHECK: self.jobs.lane_check}[task]

    def apply_async(self, entry, producer=None, advance=True, **kwargs):
        entry = self.reserve(entry) if advance else entry
        self._run(entry.task, **(entry.kwargs or {}))
        return None

    def maybe_due(self, entry, **kwargs):
        if entry.name not in QUIET_ENTRIES:
            return super().maybe_due(entry, **kwargs)
        # redbeat's own maybe_due announces every run at INFO; the lane-check
        # poll would write it 8,640 times a day.
        is_due, next_time_to_run = entry.is_due()
        if is_due:
            log.debug("beat: running %s", entry.name)
            self.apply_async(entry, **kwargs)
        return next_time_to_run

    def _run(self, task: str, **kwargs) -> None:
        try:
            self._job(task)(**kwargs)
        except (LanesError, *REDIS_DOWN) as exc:
            # A service away (Redis, the database): one line, and the next tick tries again.
            log.warning("beat job %s not done: %s", task, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        except Exception:
            # One failed run of a job must not stop the beat: the next tick tries again.
            log.exception("beat job %s failed", task)

    @property
    def standby_interval(self) -> float:
        return self.max_interval

    def tick(self, *args, **kwargs):
        if not self._checked_at_start:
            # Seed 004: every process checks the lane config at its start.
            self._checked_at_start = True
            self._run(LANE_CHECK, force=True)
        if not self.role.request():
            if self._was_active:
                log.warning("beat %s: no longer active; standing by", self.owner)
            self._was_active = False
            return self.standby_interval
        try:
            if not self._was_active:
                self._was_active = True
                self._mark_active()
                log.info("beat %s active: start-up scan and lane check", self.owner)
                self._run(MEMORY_TICK, full=True)
                self._run(LANE_CHECK, force=True)
            if not self._schedule_ready:
                self.setup_schedule()
            interval = super().tick(*args, **kwargs)
            self._mark_active()
            return interval
        except REDIS_DOWN as exc:
            # Lost Redis mid-tick: act as a standby until a lock request succeeds again.
            log.warning("beat %s: Redis did not answer during a tick (%s); standing by", self.owner, exc)
            self._was_active = False
            return self.standby_interval

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
            if self.role.active:
                self.jobs.client.delete(self.names.beat_active)
        except REDIS_DOWN:
            pass
        finally:
            self.role.release()
            try:
                super().close()
            except REDIS_DOWN:
                pass

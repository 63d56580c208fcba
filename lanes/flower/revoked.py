"""A lane waiter revoked through Lanes shows REVOKED in Flower.

A task revoked while it waits in its lane ends its wait at once and is
stored REVOKED in the result backend (``workers/app.py``), but Celery sends
no ``task-revoked`` event for a task that stops itself, so Flower, which
reads events only, would show it STARTED (with a Terminate button) for as
long as it remembers it. Every few seconds :class:`RevokedWaiters` reads the
result backend's state of the tasks Flower thinks are still under way (the
newest ones, a bounded number, in one round trip) and files a
``task-revoked`` event for each one the backend calls REVOKED, so the task
list, the task page and its buttons agree with the backend.
"""

from __future__ import annotations

import json
import logging
import time

from celery import states
from tornado.ioloop import PeriodicCallback

log = logging.getLogger("lanes.flower")

UNDER_WAY = frozenset({states.RECEIVED, states.STARTED, states.PENDING, states.RETRY})
CHECK_SECONDS = 3.0
MOST_CHECKED = 2_000


class RevokedWaiters:
    def __init__(self, app, *, every: float = CHECK_SECONDS) -> None:
        self.app = app
        self.callback = PeriodicCallback(self.check, every * 1000)
        self.callback.start()

    def under_way(self) -> list[str]:
        tasks = self.app.events.state.tasks
        found = []
        for uuid in reversed(list(tasks.keys())):  # newest last in Celery's LRU: walk back from it
            task = tasks.get(uuid)
            if task is not None and task.state in UNDER_WAY:
                found.append(uuid)
                if len(found) >= MOST_CHECKED:
                    break
        return found

    def revoked_among(self, uuids: list[str]) -> list[str]:
        """Those of ``uuids`` the result backend stores as REVOKED (blocking: run off the event loop)."""
        if not uuids:
            return []
        backend = self.app.capp.backend
        values = backend.client.mget([backend.get_key_for_task(uuid) for uuid in uuids])
        revoked = []
        for uuid, value in zip(uuids, values):
            if value is None:
                continue
            try:
                if json.loads(value).get("status") == states.REVOKED:
                    revoked.append(uuid)
            except (ValueError, AttributeError):
                continue
        return revoked

    async def check(self) -> None:
        try:
            uuids = self.under_way()
            revoked = await self.app.io_loop.run_in_executor(None, self.revoked_among, uuids)
        except Exception:  # a report: the next turn tries again
            log.warning("could not read revoked tasks from the result backend", exc_info=True)
            return
        now = time.time()
        for uuid in revoked:
            task = self.app.events.state.tasks.get(uuid)
            hostname = getattr(getattr(task, "worker", None), "hostname", None) or "lanes-flower"
            self.app.events.state.event({"type": "task-revoked", "uuid": uuid, "hostname": hostname,
                                         "timestamp": now, "local_received": now, "clock": 0,
                                         "terminated": False, "expired": False})

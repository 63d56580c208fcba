"""Flower, run in this process with Lanes' queues and lane events.

Small extensions of Flower 2, all through its own classes:

- :class:`LaneBrokerView`: the Broker page lists every lane queue (from the
  catalog, read on each visit) besides the queues live workers consume;
- :class:`LaneEventsState`: ``task-lane-*`` events become the task's ``Lane``
  line on its page and never its state, so a later revocation still shows
  as REVOKED (with its Revoke/Terminate buttons until then) and a late lane
  event never touches a finished task's result;
- :class:`LoginMetrics`: ``/metrics`` asks for the login, as every page does;
- the Lanes page and the worker page without unworkable pool controls
  (:mod:`lanes.flower.pages`); revoked lane waiters shown REVOKED
  (:mod:`lanes.flower.revoked`).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Callable

from celery.events.state import Task
from flower.events import EventsState
from flower.views.broker import BrokerView
from flower.views.monitor import Metrics
from tornado import web

from lanes.flower import lane_events

log = logging.getLogger("lanes.flower")


class LaneTask(Task):
    """A task as Flower keeps it, with its lane log and where it is now (shown on the task page)."""

    lane = None
    lane_now = None  # "waiting in lane gpu since ..." or "calling model m (lane gpu) since ..."
    _fields = (*Task._fields, "lane_now", "lane")


_POOL_OF_KWARGS = re.compile(r"'pool': '([^']+)'")
_ENDED = frozenset({"task-succeeded", "task-failed", "task-revoked", "task-rejected", "task-retried"})


def _at(timestamp) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(timestamp or time.time())))


class LaneEventsState(EventsState):
    Task = LaneTask

    def event(self, event):
        kind = event.get("type")
        if kind not in lane_events.TYPES:
            result = super().event(event)
            self._follow(event)
            return result
        uuid = event.get("uuid")
        if not uuid:
            return None
        task, _ = self.get_or_create_task(uuid)
        line = lane_events.describe(event)
        task.lane = line if not task.lane else f"{task.lane}; {line}"
        if kind == lane_events.CALLING:
            task.lane_now = f"{line} since {_at(event.get('at') or event.get('timestamp'))}"
        elif kind == lane_events.ADMITTED and event.get("outcome") != "served":
            # The call ended without an answer: the walk goes on to a fallback's lane.
            task.lane_now = (f"waiting for a fallback since {_at(event.get('timestamp'))} "
                             f"(model {event.get('model')}: {event.get('outcome')})")
        self.counter[event.get("hostname")][kind] += 1
        return None

    def _follow(self, event) -> None:
        """A started task waits in its fleet's lane until its call starts; an ended one is nowhere."""
        kind, uuid = event.get("type"), event.get("uuid")
        if not uuid or not kind or not kind.startswith("task-"):
            return
        task = self.tasks.get(uuid)
        if task is None:
            return
        if kind in _ENDED:
            task.lane_now = None
        elif kind == "task-started" and task.lane_now is None:
            found = _POOL_OF_KWARGS.search(task.kwargs or "")
            where = f"lane {found.group(1)}" if found else "its lane"
            task.lane_now = f"waiting in {where} since {_at(event.get('timestamp'))}"


class LaneBrokerView(BrokerView):
    def get_active_queue_names(self):
        live = set(super().get_active_queue_names())
        try:
            return sorted(live | set(self.application.lane_queues()))
        except Exception:  # the catalog away: still show what the workers consume
            log.warning("could not read the lane queues from the catalog", exc_info=True)
            return sorted(live)


class LoginMetrics(Metrics):
    """Flower's ``/metrics`` behind the same login as its pages (stock Flower serves it to anyone)."""

    @web.authenticated
    async def get(self):
        await super().get()


def build(capp, options, lane_queues: Callable[[], list[str]], lanes_page: Callable[[], dict] | None = None):
    """A Flower application over ``capp`` that knows Lanes' queues, lane events and pools."""
    from tornado.web import url

    from flower.app import Flower
    from flower.urls import settings as flower_settings

    from lanes.flower.pages import LanesTemplates, LanesView
    from lanes.flower.revoked import RevokedWaiters

    settings = {**flower_settings, "template_loader": LanesTemplates(flower_settings["template_path"])}
    app = Flower(capp=capp, options=options, **settings)
    app.lane_queues = lane_queues
    app.lanes_page = lanes_page or (lambda: {"pools": [], "window_seconds": 300, "warning": None})
    # Before Flower starts its event thread: it only ever reads events.state.
    app.events.state = LaneEventsState(max_tasks_in_memory=options.max_tasks,
                                       max_workers_in_memory=options.max_workers)
    # Host rules added later are matched before Flower's own catch-all rule.
    app.add_handlers(r".*", [url(r"/broker", LaneBrokerView), url(r"/metrics", LoginMetrics),
                             url(r"/lanes", LanesView, name="lanes")])
    app.revoked_waiters = RevokedWaiters(app)
    return app

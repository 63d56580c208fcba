"""Flower, run in this process with Lanes' queues and lane events.

Two small extensions of Flower 2, both through its own classes:

- :class:`LaneBrokerView`: the Broker page lists every lane queue (from the
  catalog, read on each visit) besides the queues live workers consume;
- :class:`LaneEventsState`: ``task-lane-*`` events become the task's ``Lane``
  line on its page and never its state, so a later revocation still shows
  as REVOKED (with its Revoke/Terminate buttons until then) and a late lane
  event never touches a finished task's result.
"""

from __future__ import annotations

import logging
from typing import Callable

from celery.events.state import Task
from flower.events import EventsState
from flower.views.broker import BrokerView

from lanes.flower import lane_events

log = logging.getLogger("lanes.flower")


class LaneTask(Task):
    """A task as Flower keeps it, with its lane log (shown on the task page)."""

    lane = None
    _fields = (*Task._fields, "lane")


class LaneEventsState(EventsState):
    Task = LaneTask

    def event(self, event):
        if event.get("type") not in lane_events.TYPES:
            return super().event(event)
        uuid = event.get("uuid")
        if not uuid:
            return None
        task, _ = self.get_or_create_task(uuid)
        line = lane_events.describe(event)
        task.lane = line if not task.lane else f"{task.lane}; {line}"
        self.counter[event.get("hostname")][event["type"]] += 1
        return None


class LaneBrokerView(BrokerView):
    def get_active_queue_names(self):
        live = set(super().get_active_queue_names())
        try:
            return sorted(live | set(self.application.lane_queues()))
        except Exception:  # the catalog away: still show what the workers consume
            log.warning("could not read the lane queues from the catalog", exc_info=True)
            return sorted(live)


def build(capp, options, lane_queues: Callable[[], list[str]]):
    """A Flower application over ``capp`` that knows Lanes' queues and lane events."""
    from tornado.web import url

    from flower.app import Flower
    from flower.urls import settings as flower_settings

    app = Flower(capp=capp, options=options, **flower_settings)
    app.lane_queues = lane_queues
    # Before Flower starts its event thread: it only ever reads events.state.
    app.events.state = LaneEventsState(max_tasks_in_memory=options.max_tasks,
                                       max_workers_in_memory=options.max_workers)
    # Host rules added later are matched before Flower's own catch-all rule.
    app.add_handlers(r".*", [url(r"/broker", LaneBrokerView)])
    return app

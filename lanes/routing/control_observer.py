"""The walker's reports, turned into what the pool controllers count in Redis.

One observer in ``Runtime.observers``: every backend call of a pool under
control ends here. Served answers feed the utilisation law's evidence;
overload answers (the ``overload`` controller's statuses) are counted for the
generation the request was admitted under, and only while it is still the
current one (``report.lua``): the tail of stale rejections that follows a
cut costs nothing. Background work's overload answers are counted apart and
never cut the width interactive work gets: background runs on top of the
foreground, so its rejections say it overflowed, not that the width is wrong.
"""

from __future__ import annotations

from lanes.catalog.controllers import running_kinds
from lanes.priority import Priority
from lanes.routing.observers import Attempt, BaseObserver


class ControlObserver(BaseObserver):
    def __init__(self, runtime) -> None:
        self.rt = runtime

    def on_attempt(self, attempt: Attempt) -> None:
        if attempt.pool_id is None:
            return
        pool = self.rt.table().pools.get(attempt.pool or "")
        if pool is None or pool.id != attempt.pool_id:
            return
        kinds = running_kinds(pool)
        if not kinds:
            return
        if attempt.outcome == "served":
            self.rt.control.report(pool.id, "served", seconds=attempt.call_seconds or 0.0)
            return
        overload = kinds.get("overload")
        if overload is None or attempt.status not in overload["statuses"]:
            return
        if attempt.priority is Priority.BACKGROUND:
            self.rt.control.report(pool.id, "background", status=attempt.status)
            return
        # The lane's in-flight count now (this request's slot already released)
        # is the backend's capacity as measured by this overload.
        in_flight = self.rt.lane(pool).stats().in_flight
        self.rt.control.report(pool.id, "overload", generation=attempt.generation, in_flight=in_flight,
                               status=attempt.status)

"""What ``lanes top`` shows: every lane's live state and its last minute.

:class:`TopView` reads a frame (the rows ``lanes pools`` shows, from
:mod:`lanes.lane_stats`, plus bypasses and width changes of the last minute
from the routing events) and :func:`render` draws it with rich. The event
stream is read incrementally: each event once, kept for a minute.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from rich.console import Group
from rich.table import Table
from rich.text import Text

from lanes.priority import Priority

WINDOW_SECONDS = 60.0
BAR_WIDTH = 12
COUNTED = ("lane_bypass", "width_change")


@dataclass
class Frame:
    at: float
    rows: list[dict]
    last_minute: dict[str, dict[str, int]]  # pool -> kind -> count
    error: str | None = None


@dataclass
class RecentEvents:
    """Bypasses and width changes per pool over the last ``window`` seconds."""

    log: object  # lanes.routing.events.EventLog
    window: float = WINDOW_SECONDS
    _seen: deque = field(default_factory=deque)  # (time, kind, pool), oldest first
    _last_id: str | None = None

    def read(self, now: float) -> dict[str, dict[str, int]]:
        while True:  # catch up in pages (a burst of events between two frames)
            page = self.log.newer(self._last_id, since=now - self.window, count=5_000)
            for event in page:
                if event.kind in COUNTED and event.pool:
                    self._seen.append((event.time, event.kind, event.pool))
            if page:
                self._last_id = page[-1].id
            if len(page) < 5_000:
                break
        while self._seen and self._seen[0][0] < now - self.window:
            self._seen.popleft()
        counts: dict[str, dict[str, int]] = {}
        for _, kind, pool in self._seen:
            per_pool = counts.setdefault(pool, dict.fromkeys(COUNTED, 0))
            per_pool[kind] += 1
        return counts


class TopView:
    """Reads frames from one Redis and one catalog."""

    def __init__(self, settings, client, engine) -> None:
        from lanes.routing.events import EventLog

        self.settings = settings
        self.client = client
        self.engine = engine
        self.recent = RecentEvents(EventLog(client, prefix=settings.key_prefix, enabled=False))

    def frame(self) -> Frame:
        from lanes.catalog import load_routing
        from lanes.lane_stats import pool_rows

        now = time.time()
        table = load_routing(self.engine)
        rows = pool_rows(self.settings, self.client, table.pools.values())
        return Frame(at=now, rows=rows, last_minute=self.recent.read(now))


def bar(in_flight: int, width: int) -> Text:
    """In flight against width; cells past the width (a lane draining after a shrink) in red."""
    cells = max(width, 1)
    scale = BAR_WIDTH / max(cells, in_flight)
    used = round(min(in_flight, width) * scale)
    over = round(max(0, in_flight - width) * scale)
    free = max(0, round(cells * scale) - used)
    text = Text()
    text.append("█" * used, style="green" if in_flight < width else "yellow")
    text.append("█" * over, style="red")
    text.append("·" * free, style="dim")
    text.append(f" {in_flight}/{width}")
    return text


def _number(value) -> str:
    return "-" if value is None else f"{value:g}"


def render(frame: Frame, *, source: str) -> Group:
    title = Text.assemble(("lanes top", "bold"), f"  {source}  ",
                          time.strftime("%H:%M:%S", time.localtime(frame.at)), ("  q quits", "dim"))
    table = Table(expand=False, header_style="bold")
    for name, justify in (("pool", "left"), ("in flight/width", "left"), ("queued i/u/b", "right"),
                          ("p95 wait ms", "right"), ("mean hold ms", "right"), ("bypasses 1m", "right"),
                          ("resizes 1m", "right"), ("controller", "left")):
        table.add_column(name, justify=justify, no_wrap=name in ("pool", "in flight/width", "queued i/u/b"))
    for row in frame.rows:
        minute = frame.last_minute.get(row["pool"], {})
        table.add_row(
            row["pool"],
            bar(row["in_flight"], row["width"]),
            "/".join(str(row["queued"][p.label]) for p in Priority),
            _number(row["wait_p95_ms"]),
            _number(row["mean_hold_ms"]),
            str(minute.get("lane_bypass", 0)),
            str(minute.get("width_change", 0)),
            ",".join(sorted(row["controllers"])) or "off",
        )
    parts = [title, table]
    if not frame.rows:
        parts.append(Text("no pools in the catalog: lanes catalog apply FILE", style="yellow"))
    if frame.error:
        parts.append(Text(frame.error, style="red"))
    return Group(*parts)

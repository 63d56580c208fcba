"""What ``lanes top`` shows: every lane's live state and its recent past.

:class:`TopView` reads a frame (the rows ``lanes pools`` shows, from
:mod:`lanes.ops.lane_stats`; lane waits p50/p95 per priority over the last five
minutes, :mod:`lanes.ops.waits`; bypasses and width changes of the last
minute from the routing events, an operator's resizes included) and
:func:`render` draws it with rich, for the terminal's width: columns are
dropped, least useful first, rather than squeezed into ``2...``. The event
stream is read incrementally: each event once, kept for a minute.

A lane whose Redis state was lost (a restart, a flush) is flagged ``LOST``;
one in its quiet period after such a loss, ``quiet Ns``.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from lanes.ops.lane_stats import queued_text
from lanes.priority import Priority

WINDOW_SECONDS = 60.0
WAIT_WINDOW_SECONDS = 300.0
BAR_WIDTH = 12
COUNTED = ("lane_bypass", "width_change")
# Columns a narrow terminal drops, first to last; the pool, its bar, its
# queue and its interactive wait always stay.
DROP_ORDER = ("controller", "mean hold ms", "bypasses 1m", "wait u/b p50/p95", "resizes 1m", "state")


@dataclass
class Frame:
    at: float
    rows: list[dict]
    last_minute: dict[str, dict[str, int]]  # pool -> kind -> count
    waits: dict[str, dict[str, dict]] = field(default_factory=dict)  # pool -> priority -> {count, p50_ms, p95_ms}
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
        from lanes.ops.lane_stats import pool_rows
        from lanes.ops.waits import recent_waits

        now = time.time()
        # One cheap round trip first: a Redis that does not answer is told
        # within one timeout, not after every lane's script has waited for it.
        self.client.ping()
        table = load_routing(self.engine)
        rows = pool_rows(self.settings, self.client, table.pools.values())
        waits = recent_waits(self.client, prefix=self.settings.key_prefix, window=WAIT_WINDOW_SECONDS, now=now)
        return Frame(at=now, rows=rows, last_minute=self.recent.read(now), waits=waits)


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
    return "-" if value is None else f"{value:.0f}"


def _wait(waits: dict, priority: Priority) -> str:
    seen = waits.get(priority.label) or {}
    if not seen.get("count"):
        return "-"
    return f"{_number(seen['p50_ms'])}/{_number(seen['p95_ms'])}"


def _state(row: dict) -> Text:
    if row.get("state_lost"):
        return Text("LOST", style="bold red")
    if row.get("quiet_seconds"):
        return Text(f"quiet {row['quiet_seconds']:.0f}s", style="yellow")
    return Text("ok", style="dim")


def _controller_text(row: dict) -> str:
    kinds = ",".join(sorted(row["controllers"])) or "off"
    if row.get("fail_closed"):
        return f"{kinds} (fail-closed)"
    return kinds


def _cells(row: dict, frame: Frame) -> dict[str, object]:
    minute = frame.last_minute.get(row["pool"], {})
    waits = frame.waits.get(row["pool"], {})
    return {
        "pool": row["pool"],
        "in flight/width": bar(row["in_flight"], row["width"]),
        "queued i/u/b": queued_text(row),
        "wait i p50/p95": _wait(waits, Priority.INTERACTIVE),
        "wait u/b p50/p95": f"{_wait(waits, Priority.USER_TOOL)} {_wait(waits, Priority.BACKGROUND)}",
        "mean hold ms": _number(row["mean_hold_ms"]),
        "bypasses 1m": str(minute.get("lane_bypass", 0)),
        "resizes 1m": str(minute.get("width_change", 0)),
        "state": _state(row),
        "controller": _controller_text(row),
    }


COLUMNS = ("pool", "in flight/width", "queued i/u/b", "wait i p50/p95", "wait u/b p50/p95", "mean hold ms",
           "bypasses 1m", "resizes 1m", "state", "controller")
LEFT = {"pool", "in flight/width", "state", "controller"}


def _table(frame: Frame, columns: tuple[str, ...]) -> Table:
    table = Table(expand=False, header_style="bold")
    for name in columns:
        table.add_column(name, justify="left" if name in LEFT else "right", no_wrap=True)
    for row in frame.rows:
        cells = _cells(row, frame)
        table.add_row(*(cells[name] for name in columns))
    return table


def _fits(table: Table, width: int) -> bool:
    measured = Console(width=10_000, file=None).measure(table)
    return measured.maximum <= width


def render(frame: Frame, *, source: str, width: int | None = None) -> Group:
    """The frame for a terminal ``width`` columns wide (None: no limit)."""
    title = Text.assemble(("lanes top", "bold"), f"  {source}  ",
                          time.strftime("%H:%M:%S", time.localtime(frame.at)), ("  q quits", "dim"))
    columns = COLUMNS
    table = _table(frame, columns)
    dropped = []
    for name in DROP_ORDER:
        if width is None or _fits(table, width):
            break
        columns = tuple(c for c in columns if c != name)
        dropped.append(name)
        table = _table(frame, columns)
    parts = [title, table]
    if dropped:
        parts.append(Text(f"narrow terminal: not shown: {', '.join(dropped)}", style="dim"))
    for row in frame.rows:
        reason = row.get("fail_closed")
        if reason:
            parts.append(Text(f"{row['pool']}: {reason}", style="yellow"))
    lost = [row["pool"] for row in frame.rows if row.get("state_lost")]
    if lost:
        parts.append(Text(f"lane state lost in Redis (restart or flush?): {', '.join(lost)}; holders re-register "
                          "on their next renewal, new work waits one lease period", style="red"))
    if not frame.rows:
        parts.append(Text("no pools in the catalog: lanes catalog apply FILE", style="yellow"))
    if frame.error:
        parts.append(Text(frame.error, style="red"))
    return Group(*parts)

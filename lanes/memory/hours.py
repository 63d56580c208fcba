"""UTC hours and the windows of chat hours a memory tick scans.

An hour is named by its start (an aware UTC datetime on the hour). An hour is
*completed* once its end has passed: at 10:02 the hours up to 09:00-10:00 are
completed and 10:00-11:00 is in progress, so it is never scanned. Windows are
half-open ``[start, end)`` ranges of hour starts, built with timedelta
arithmetic on aware datetimes, so midnight, month and year ends are ordinary
hours.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone

from lanes.errors import InvalidInput

HOUR = timedelta(hours=1)
HOURLY_SCAN_HOURS = 2


def as_utc(value: datetime) -> datetime:
    """An aware UTC datetime; a naive one (as SQLite returns) is taken as UTC."""
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def hour_start(moment: datetime) -> datetime:
    return as_utc(moment).replace(minute=0, second=0, microsecond=0)


def day_start(moment: datetime) -> datetime:
    return hour_start(moment).replace(hour=0)


def utc_day(moment: datetime) -> date:
    return as_utc(moment).date()


@dataclass(frozen=True)
class Window:
    """Hour starts ``start <= hour < end``."""

    start: datetime
    end: datetime

    def hours(self) -> list[datetime]:
        out, hour = [], self.start
        while hour < self.end:
            out.append(hour)
            hour += HOUR
        return out

    def __contains__(self, hour: datetime) -> bool:
        return self.start <= as_utc(hour) < self.end


def recent_window(now: datetime) -> Window:
    """The last two completed hours (the HH:02 tick)."""
    end = hour_start(now)
    return Window(end - HOURLY_SCAN_HOURS * HOUR, end)


def retention_window(now: datetime, retention_days: int) -> Window:
    """Every completed hour of the retention window (start-up and the 03:02 tick)."""
    if retention_days < 1:
        raise InvalidInput(f"retention of {retention_days!r} days must be at least 1")
    end = hour_start(now)
    return Window(end - timedelta(days=retention_days), end)


def parse_time(text: str) -> datetime:
    """An ISO 8601 time; one without a zone is refused (times are UTC, say so)."""
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(f"time {text!r} is not ISO 8601; write e.g. 2026-03-01T10:02:00Z") from None
    if value.tzinfo is None:
        raise InvalidInput(f"time {text!r} has no time zone; add Z (UTC) or an offset like +00:00")
    return value.astimezone(timezone.utc)

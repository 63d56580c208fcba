"""``lanes top``: every lane, live, refreshed every second; ``q`` quits."""

from __future__ import annotations

import click

from lanes.cli.common import pass_settings
from lanes.errors import InvalidInput


@click.command(name="top")
@click.option("--interval", type=float, default=1.0, show_default=True, help="Seconds between refreshes.")
@click.option("--once", is_flag=True, help="Print one frame and exit (no live view).")
@pass_settings
def command(settings, interval, once) -> None:
    """A live view of every lane: in flight against width, queued per priority,
    lane waits p50/p95 per priority over five minutes, mean hold, bypasses and
    width changes (controllers' and operators') in the last minute, lanes whose
    Redis state was lost. Columns are dropped on a narrow terminal.

    Reads the Redis and catalog the settings name (LANES_REDIS_URL,
    LANES_DATABASE_URL, or the state folder's embedded ones). q or Ctrl-C quits.
    """
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    from rich.console import Console

    from lanes.catalog import open_catalog
    from lanes.embedded import client_redis_url
    from lanes.redis_conn import connect
    from lanes.settings import mask_url
    from lanes.cli.top_view import TopView, render

    if not 0.1 <= interval <= 60:
        raise InvalidInput(f"--interval {interval} is out of range; give 0.1 to 60 seconds")
    url = client_redis_url(settings)
    # A screen, not a worker: a Redis that does not answer is said within
    # READ_TIMEOUT, never retried behind the operator's back.
    client = connect(url, timeout=min(READ_TIMEOUT, settings.redis_timeout_seconds), retry=Retry(NoBackoff(), 0))
    engine = open_catalog(settings, create=False)
    view = TopView(settings, client, engine)
    source = f"redis {mask_url(url)}"
    console = Console()
    try:
        if once:
            console.print(render(view.frame(), source=source, width=console.width))
            return
        try:
            _live(console, view, source, interval)
        except KeyboardInterrupt:
            pass  # Ctrl-C quits like q
    finally:
        client.close()
        engine.dispose()


# Seconds a Redis command of `lanes top` may take before the screen says
# Redis does not answer (the operator wanted to know within 2 s).
READ_TIMEOUT = 1.0
KEY_POLL = 0.05


def _live(console, view, source: str, interval: float) -> None:
    import time

    from rich.live import Live

    from lanes.cli.top_view import Frame, render

    reader = _FrameReader(view, interval)
    shown = Frame(at=time.time(), rows=[], last_minute={}, error="reading the lanes...")
    with _Keys() as keys, Live(render(shown, source=source, width=console.width), console=console, screen=True,
                                auto_refresh=False) as live:
        reader.start()
        while True:
            # Keys are read here, frames in the reader's thread: q quits at
            # once even while a read waits on a Redis that does not answer.
            if keys.pressed(KEY_POLL) in ("q", "Q"):
                return
            frame = reader.latest(now=time.monotonic())
            if frame is not None:
                live.update(render(frame, source=source, width=console.width), refresh=True)


class _FrameReader:
    """Reads frames in a daemon thread; the newest one, with what went wrong since."""

    def __init__(self, view, interval: float) -> None:
        import threading

        self.view = view
        self.interval = interval
        self._lock = threading.Lock()
        self._frame = None
        self._error: str | None = None
        self._error_at: float | None = None
        self._fresh = False
        self._reading_since: float | None = None
        self._shown_stall = False
        self._thread = threading.Thread(target=self._run, name="lanes-top-reader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        import time

        while True:
            started = time.monotonic()
            with self._lock:
                self._reading_since = started
            try:
                frame = self.view.frame()
                error = None
            except Exception as exc:  # Redis or the catalog away: say so, keep the last frame, try again
                frame, error = None, _why(exc)
            with self._lock:
                self._reading_since = None
                self._shown_stall = False
                if frame is not None:
                    self._frame = frame
                self._error = error
                self._fresh = True
            time.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    def latest(self, *, now: float):
        """The frame to draw now, or None when nothing changed since the last call."""
        import time

        from lanes.cli.top_view import Frame

        with self._lock:
            stalled = self._reading_since is not None and now - self._reading_since > READ_TIMEOUT * 1.5
            if not self._fresh and not (stalled and not self._shown_stall):
                return None
            frame = self._frame or Frame(at=time.time(), rows=[], last_minute={})
            error = self._error
            if stalled:
                self._shown_stall = True
                error = f"Redis has not answered for {now - self._reading_since:.1f} s; still trying"
            self._fresh = False
        frame.error = error
        return frame


def _why(exc: Exception) -> str:
    from lanes.errors import RedisUnavailable
    from lanes.redis_conn import REDIS_UNAVAILABLE

    if isinstance(exc, (*REDIS_UNAVAILABLE, RedisUnavailable)):
        return f"Redis did not answer within {READ_TIMEOUT:g} s ({type(exc).__name__}); showing the last frame, retrying"
    return f"could not refresh: {type(exc).__name__}: {exc}"


class _Keys:
    """Single key presses from the terminal (cbreak mode, restored on exit)."""

    def __enter__(self) -> "_Keys":
        import sys
        import termios
        import tty

        self._fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
        self._saved = None
        if self._fd is not None:
            self._saved = termios.tcgetattr(self._fd)
            tty.setcbreak(self._fd)
        return self

    def pressed(self, timeout: float) -> str | None:
        import os
        import select
        import time

        if self._fd is None:  # no terminal: no keys, Ctrl-C still quits
            time.sleep(timeout)
            return None
        ready, _, _ = select.select([self._fd], [], [], timeout)
        if not ready:
            return None
        return os.read(self._fd, 1).decode(errors="replace")

    def __exit__(self, *_) -> None:
        if self._saved is not None:
            import termios

            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)

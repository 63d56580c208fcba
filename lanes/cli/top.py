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
    wait p95, mean hold, bypasses and width changes in the last minute.

    Reads the Redis and catalog the settings name (LANES_REDIS_URL,
    LANES_DATABASE_URL, or the state folder's embedded ones). q or Ctrl-C quits.
    """
    from rich.console import Console

    from lanes.catalog import open_catalog
    from lanes.embedded import client_redis_url
    from lanes.redis_conn import connect
    from lanes.settings import mask_url
    from lanes.top import TopView, render

    if not 0.1 <= interval <= 60:
        raise InvalidInput(f"--interval {interval} is out of range; give 0.1 to 60 seconds")
    url = client_redis_url(settings)
    client = connect(url, timeout=settings.redis_timeout_seconds)
    engine = open_catalog(settings, create=False)
    view = TopView(settings, client, engine)
    source = f"redis {mask_url(url)}"
    console = Console()
    try:
        first = view.frame()  # a Redis or catalog that does not answer fails here, in one line
        if once:
            console.print(render(first, source=source))
            return
        try:
            _live(console, view, first, source, interval)
        except KeyboardInterrupt:
            pass  # Ctrl-C quits like q
    finally:
        client.close()
        engine.dispose()


def _live(console, view, first, source: str, interval: float) -> None:
    import time

    from rich.live import Live

    from lanes.top import render

    frame = first
    with _Keys() as keys, Live(render(frame, source=source), console=console, screen=True,
                                auto_refresh=False) as live:
        next_at = time.monotonic() + interval
        while True:
            if keys.pressed(max(0.0, next_at - time.monotonic())) in ("q", "Q"):
                return
            if time.monotonic() < next_at:
                continue
            next_at += interval
            try:
                frame = view.frame()
            except Exception as exc:  # Redis or the catalog away: keep the last frame, try again next time
                frame.error = f"could not refresh: {type(exc).__name__}: {exc}"
            live.update(render(frame, source=source), refresh=True)


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

"""Pieces every subcommand shares: settings, JSON or table output."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import click
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from lanes.errors import InvalidInput
from lanes.settings import Settings, load_settings, mask_url, unknown_variables

# Values of these settings are never echoed back: they may hold a password.
_SECRET_FIELDS = {"redis_url", "database_url", "api_token", "flower_basic_auth"}

_warned = False


def get_settings() -> Settings:
    """Settings from the environment; a bad value is a one-line input error.

    Unknown ``LANES_*`` variables get a warning (once per process), and a
    state folder that cannot be used is refused before anything is written.
    """
    global _warned
    if not _warned:
        _warned = True
        for warning in unknown_variables():
            click.echo(f"warning: {warning}", err=True)
    try:
        settings = load_settings()
    except ValidationError as exc:
        raise InvalidInput(f"bad settings: {_problems(exc)}") from None
    if not (settings.redis_url and settings.database_url):
        check_state_dir(settings.state_dir)
    return settings


def _problems(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        field = "_".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        if isinstance(value, str) and "://" in value:
            value = mask_url(value)  # a URL's password never reaches the terminal
        shown = "" if field in _SECRET_FIELDS or not field else f" (got {value!r})"
        name = f"LANES_{field.upper()}: " if field else ""
        problems.append(f"{name}{message}{shown}")
    return "; ".join(problems)


def check_state_dir(path: Path) -> None:
    """Refuse a state folder that is a file, or that cannot be written or created."""
    fix = "set LANES_STATE_DIR to a folder you can write"
    if path.exists():
        if not path.is_dir():
            raise InvalidInput(f"state folder {path} is a file, not a folder; move it away or {fix}")
        if not os.access(path, os.W_OK | os.X_OK):
            raise InvalidInput(f"state folder {path} is not writable; {fix}")
        return
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InvalidInput(f"state folder {path} cannot be created: {ancestor} is a file; {fix}")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InvalidInput(f"state folder {path} cannot be created: {ancestor} is not writable; {fix}")


def pass_settings(func: Callable) -> Callable:
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(get_settings(), *args, **kwargs)

    return wrapper


def live_workers(settings: Settings, fleets: list[str]) -> dict[str, list[str]]:
    """Each fleet's live workers, from their heartbeats (lanes.presence)."""
    from lanes.embedded import client_redis_url
    from lanes.presence import WorkerPresence
    from lanes.redis_conn import connect

    client = connect(client_redis_url(settings), timeout=settings.redis_timeout_seconds)
    try:
        return WorkerPresence(client, prefix=settings.key_prefix).live_by_fleet(fleets)
    finally:
        client.close()


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def emit_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]], *,
               drop_order: Sequence[str] = (), prose: Sequence[str] = ()) -> None:
    """A table that fits the terminal without cutting a cell.

    The first column (a name) never wraps or shortens; headers wrap at their
    spaces, and so do the values of ``prose`` columns (sentences), which take
    the width left over; if that is not enough, the columns in ``drop_order``
    are left out, in that order, and a note says so (``--json`` shows everything).
    """
    console = Console()
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    natural = {c: max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)}
    if _width(natural, columns) <= console.width:
        console.print(_table(title, columns, columns, cells, None))
        return
    widths = {c: _narrowest(c, [row[i] for row in cells], prose=c in prose) for i, c in enumerate(columns)}
    shown = list(columns)
    for name in drop_order:
        if _width(widths, shown) <= console.width:
            break
        shown.remove(name)
    for name in (c for c in prose if c in shown):
        widths[name] += max(0, console.width - _width(widths, shown))
    console.print(_table(title, columns, shown, cells, widths))
    hidden = [c for c in columns if c not in shown]
    if hidden:
        click.echo(f"({', '.join(hidden)} left out to fit {console.width} columns; --json shows all)")


def _width(widths: dict[str, int], shown: Sequence[str]) -> int:
    # Each column takes its width, a space either side and one border.
    return sum(widths[c] + 3 for c in shown) + 1


def _narrowest(header: str, values: list[str], *, prose: bool = False) -> int:
    """Wide enough for every value (for prose, its longest word) and the
    header's longest word: headers and prose wrap at their spaces, no value is
    ever cut."""
    words = [len(word) for v in values for word in v.split()] if prose else [len(v) for v in values]
    return max(words + [len(word) for word in header.split()])


def _table(title: str | None, columns: Sequence[str], shown: Sequence[str], cells: list[list[str]],
           widths: dict[str, int] | None) -> Table:
    """Columns at their natural width (``widths`` None) or at exactly ``widths``."""
    table = Table(title=title, show_lines=False)
    positions = [columns.index(c) for c in shown]
    for column, position in zip(shown, positions):
        table.add_column(column, width=None if widths is None else widths[column], no_wrap=position == 0)
    for row in cells:
        table.add_row(*(row[i] for i in positions))
    return table

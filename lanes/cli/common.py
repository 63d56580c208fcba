"""Pieces every subcommand shares: settings, JSON or table output."""

from __future__ import annotations

import functools
import json
from typing import Any, Callable, Iterable, Sequence

import click
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from lanes.errors import InvalidInput
from lanes.settings import Settings, load_settings


def get_settings() -> Settings:
    """Settings from the environment; a bad value is a one-line input error."""
    try:
        return load_settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"LANES_{'_'.join(str(p) for p in err['loc']).upper()}: {err['msg']} (got {err.get('input')!r})"
            for err in exc.errors()
        )
        raise InvalidInput(f"bad settings: {problems}") from None


def pass_settings(func: Callable) -> Callable:
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(get_settings(), *args, **kwargs)

    return wrapper


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def emit_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    table = Table(title=title, show_lines=False)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    Console().print(table)

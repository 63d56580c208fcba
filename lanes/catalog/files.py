"""Reading catalog files (TOML or YAML) and writing documents back out."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import tomli_w
import yaml

from lanes.catalog import yaml_strict
from lanes.errors import InvalidInput

FORMATS = {".toml": "toml", ".yaml": "yaml", ".yml": "yaml"}


def read_document(path: str | Path, *, format: str | None = None) -> Any:
    """The parsed file; any read or syntax error is one :class:`InvalidInput` line."""
    path = Path(path)
    format = format or FORMATS.get(path.suffix.lower())
    if format is None:
        raise InvalidInput(f"{path}: unknown file type {path.suffix!r} (use .toml, .yaml or .yml)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else exc
        raise InvalidInput(f"{path}: cannot read the file: {reason}") from None
    return parse(text, format, source=str(path))


def parse(text: str, format: str, *, source: str = "<text>") -> Any:
    if len(text) > yaml_strict.MAX_DOCUMENT_BYTES:
        limit = yaml_strict.MAX_DOCUMENT_BYTES // (1024 * 1024)
        raise InvalidInput(f"{source}: the file is over {limit} MiB; a catalog file is a few hundred KiB at most")
    if format == "toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InvalidInput(f"{source}: not valid TOML: {exc}") from None
    if format == "yaml":
        try:
            document = yaml_strict.load(text)
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise InvalidInput(f"{source}: not valid YAML{at}: {problem}") from None
        # An empty YAML file is an empty catalog, like an empty TOML file.
        return {} if document is None else document
    raise InvalidInput(f"unknown catalog format {format!r} (use toml or yaml)")


def dump(document: dict, format: str) -> str:
    """``document`` as TOML or YAML text, sections in file order, unset keys left out."""
    document = _drop_none(document)
    if format == "toml":
        return _toml(document)
    if format == "yaml":
        return yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
    raise InvalidInput(f"unknown catalog format {format!r} (use toml or yaml)")


def _toml(document: dict) -> str:
    """One ``[[section]]`` block per item, nested tables inline.

    tomli_w alone would split each pool's controller into its own
    ``[pools.controller]`` block; a reader wants the pool on one screen.
    """
    blocks = []
    for section, items in document.items():
        for item in items:
            lines = [f"[[{section}]]"]
            lines += [f"{key} = {_inline(value)}" for key, value in item.items()]
            blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n" if blocks else ""


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_inline(v)}" for k, v in value.items()) + " }" if value else "{}"
    if isinstance(value, list):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    # tomli_w quotes strings and formats numbers and booleans exactly.
    return tomli_w.dumps({"v": value})[len("v = ") :].rstrip("\n")


def _drop_none(value: Any) -> Any:
    """TOML has no null: a missing key means "not set"."""
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value

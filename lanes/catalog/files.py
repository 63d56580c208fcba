"""Reading catalog files (TOML or YAML) and writing documents back out.

A file costs what the cap allows, whatever it is: at most
:data:`~lanes.catalog.yaml_strict.MAX_DOCUMENT_BYTES` (plus one) bytes are
read, so a 200 MB file or ``/dev/zero`` is refused without being loaded. A
document nested deeper than :data:`MAX_DEPTH` is refused with one line (the
parsers recurse; 10,000 levels would otherwise end in a RecursionError).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import tomli_w
import yaml

from lanes.catalog import yaml_strict
from lanes.errors import InvalidInput

FORMATS = {".toml": "toml", ".yaml": "yaml", ".yml": "yaml"}
# Containers inside containers. A catalog is five deep at most
# (section, item, controller list, controller, statuses); the parsers recurse
# about twice per level, so the bound stays far from Python's stack limit.
MAX_DEPTH = 32


def read_document(path: str | Path, *, format: str | None = None) -> Any:
    """The parsed file; any read or syntax error is one :class:`InvalidInput` line."""
    path = Path(path)
    format = format or FORMATS.get(path.suffix.lower())
    if format is None:
        raise InvalidInput(f"{path}: unknown file type {path.suffix!r} (use .toml, .yaml or .yml)")
    limit = yaml_strict.MAX_DOCUMENT_BYTES
    try:
        with path.open("rb") as file:
            data = file.read(limit + 1)  # never more than the cap, whatever the file is
        if len(data) > limit:
            raise InvalidInput(f"{path}: {_too_large()}")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else exc
        raise InvalidInput(f"{path}: cannot read the file: {reason}") from None
    return parse(text, format, source=str(path))


def _too_large() -> str:
    limit = yaml_strict.MAX_DOCUMENT_BYTES // (1024 * 1024)
    return f"the file is over {limit} MiB; a catalog file is a few hundred KiB at most"


def parse(text: str, format: str, *, source: str = "<text>") -> Any:
    if len(text) > yaml_strict.MAX_DOCUMENT_BYTES:
        raise InvalidInput(f"{source}: {_too_large()}")
    try:
        document = _parse(text, format, source)
    except RecursionError:
        document = None  # only a document nested far deeper than the bound gets here
        deep = True
    else:
        deep = too_deep(document)
    if deep:
        raise InvalidInput(f"{source}: nested more than {MAX_DEPTH} levels deep; a catalog needs five at most")
    return document


def too_deep(document: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``document`` nests lists and tables more than ``limit`` levels (walked without recursion)."""
    stack = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > limit:
                return True
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _parse(text: str, format: str, source: str) -> Any:
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

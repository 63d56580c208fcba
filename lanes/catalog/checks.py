"""Single-value checks for catalog documents, and the wording of their problems.

Each check returns the value or raises ``ValueError`` with a sentence that
starts with the offending value; :func:`pydantic_problems` puts the key path
in front of it.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError

from lanes.catalog import controllers
from lanes.catalog.shown import show, show_hidden
from lanes.catalog.tables import URL_LENGTH
from lanes.errors import InvalidInput
from lanes.priority import Priority

# Pool names end up in Celery queue names and Redis keys; keep them plain.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# Model ids are whatever the backend calls them: "Qwen/Qwen2.5-7B", "gpt-4o:latest".
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


# Upper bounds: PostgreSQL's INTEGER and the URL columns' length. SQLite would
# store bigger values (or fail with a raw OverflowError past 2^63), so the
# document refuses them first and both databases behave the same.
MAX_INTEGER = 2**31 - 1


def known(names: Iterable[str]) -> str:
    names = sorted(names)
    if not names:
        return " (it declares none)"
    # Names in the file may be anything, long ones included: shorten them.
    listed = ", ".join(name if len(name) <= 40 else show(name) for name in names[:8])
    listed += ", ..." if len(names) > 8 else ""
    return f" (known: {listed})"


def name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError(
            f"{show(value)} is not a valid name (1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit)"
        )
    return value


def model_name(value: str) -> str:
    if not _MODEL_NAME.fullmatch(value):
        raise ValueError(f"{show(value)} is not a valid model id (1-200 characters, no spaces)")
    return value


def env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        # Most often the key itself, pasted here: never echo it into a log.
        raise ValueError(
            f"{show_hidden(value)} is not an environment variable name "
            "(put the key itself in the environment and name the variable here)"
        )
    return value


def at_least(low: int, what: str) -> Callable[[int], int]:
    """``low`` or more, and at most :data:`MAX_INTEGER` (what every database stores)."""

    def check(value: int) -> int:
        if value < low:
            raise ValueError(f"{show(value)} is not {what} >= {low}")
        if value > MAX_INTEGER:
            raise ValueError(f"{show(value)} is too large for {what} (at most {MAX_INTEGER})")
        return value

    return check


def within(low: int, high: int, what: str) -> Callable[[int], int]:
    def check(value: int) -> int:
        if not low <= value <= high:
            raise ValueError(f"{show(value)} is not {what} in {low}..{high}")
        return value

    return check


def one_of(choices: tuple[str, ...], what: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in choices:
            raise ValueError(f"{show(value)} is not {what} (known: {', '.join(choices)})")
        return value

    return check


def _unwritten(value: str) -> tuple[int, str] | None:
    """The first whitespace or control character of ``value`` (position, name), if any.

    PostgreSQL refuses a NUL in text and SQLite stores it; a newline or a space
    in a URL is a paste error either way. Refused here so both databases (and
    the HTTP client) see the same thing.
    """
    for position, char in enumerate(value):
        if char.isspace() or unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Zs"):
            name = unicodedata.name(char, "")
            code = f"U+{ord(char):04X}"
            return position, f"{name.lower()} ({code})" if name else f"control character {code}"
    return None


def distinct(what: str) -> Callable[[list], list]:
    """A list whose items differ (a replica listed twice would get twice its share of calls)."""

    def check(values: list) -> list:
        seen = set()
        for value in values:
            key = value.rstrip("/") if isinstance(value, str) else value
            if key in seen:
                raise ValueError(f"{show(value)} is listed twice; list {what} once")
            seen.add(key)
        return values

    return check


def url(value: str) -> str:
    bad = _unwritten(value)
    if bad is not None:
        raise ValueError(
            f"{show(value)} has a {bad[1]} at position {bad[0]}; a URL has no spaces or control characters "
            "(percent-encode them)"
        )
    if len(value) > URL_LENGTH:
        raise ValueError(f"{show(value)} is {len(value)} characters long; a URL may have at most {URL_LENGTH}")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (raises on a non-numeric port)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{show(value)} is not an http(s) URL with a host")
    if parts.username or parts.password:
        raise ValueError(f"{show(value)} holds credentials; name an environment variable in api_key_env instead")
    if parts.query or parts.fragment:
        raise ValueError(f"{show(value)} has a query or fragment; give the base URL only")
    return value


def priority(value: Any) -> str:
    if isinstance(value, str):
        try:
            return Priority.parse(value).label
        except InvalidInput:
            pass
    labels = ", ".join(p.label for p in Priority)
    raise ValueError(f"{show(value)} is not a priority (known: {labels})")


def controller(path: str, value: Any) -> list[str]:
    """Problems of a pool's ``controller``: one table, or a list of tables of distinct kinds."""
    if isinstance(value, list):
        if not value:
            return [f"{path}: [] is empty; write {{kind = \"off\"}} for no controller"]
        found, seen = [], set()
        for index, entry in enumerate(value):
            found.extend(_one_controller(f"{path}[{index}]", entry))
            kind = entry.get("kind") if isinstance(entry, dict) else None
            if isinstance(kind, str) and kind in seen:
                found.append(f"{path}[{index}].kind: {kind!r} is named twice; each kind runs once per pool")
            seen.add(kind)
        if controllers.OFF in seen and len(value) > 1:
            found.append(f"{path}: 'off' cannot be combined with other controllers; remove it or the others")
        return found
    return _one_controller(path, value)


def _one_controller(path: str, value: Any) -> list[str]:
    if not isinstance(value, dict):
        return [f"{path}: {show(value)} is not a table with a kind"]
    kind = value.get("kind")
    if "kind" not in value:
        return [f"{path}.kind: missing; say which controller (known: {', '.join(controllers.KINDS)})"]
    if not isinstance(kind, str) or kind not in controllers.KINDS:
        return [f"{path}.kind: {show(kind)} is not a controller kind (known: {', '.join(controllers.KINDS)})"]
    params = {k: v for k, v in value.items() if k != "kind"}
    known_params = controllers.KINDS[kind]
    unknown = [
        f"{path}.{_key(param)}: {show(v)} is not a parameter of controller {kind!r} "
        f"(known: {', '.join(sorted(known_params)) or 'none'})"
        for param, v in params.items()
        if param not in known_params
    ]
    checked = {k: v for k, v in params.items() if k in known_params}
    return unknown + [f"{path}.{param}: {message}" for param, message in controllers.problems(checked, kind)]


def key_shown(key: Any) -> str:
    """A key as it appears in a path: itself when short and plain, else shown (shortened)."""
    return key if isinstance(key, str) and _NAME.fullmatch(key) and len(key) <= 40 else show(key)


_key = key_shown


def duplicates(section: str, named: list[tuple[int, str]]) -> list[str]:
    first: dict[str, int] = {}
    problems = []
    for index, item_name in named:
        if item_name in first:
            first_path = f"{section}[{first[item_name]}]"
            problems.append(f"{section}[{index}].name: {show(item_name)} is already the name of {first_path}")
        else:
            first[item_name] = index
    return problems


_TYPE_WORDS = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "string_type": "a string",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
}


def pydantic_problems(prefix: str, exc: ValidationError, model: type[BaseModel]) -> list[str]:
    problems = []
    for error in exc.errors():
        path = prefix + "".join(f"[{part}]" if isinstance(part, int) else f".{_key(part)}" for part in error["loc"])
        problems.append(problem_line(path, error, model.model_fields))
    return problems


def problem_line(path: str, error: dict, known: Iterable[str] = ()) -> str:
    """One pydantic error as a line naming its key path and the offending value."""
    kind = error["type"]
    value = error.get("input")
    if kind == "missing":
        return f"{path}: missing (required)"
    if kind == "extra_forbidden":
        return f"{path}: unknown key" + (f" (known: {', '.join(known)})" if known else "")
    if kind in _TYPE_WORDS:
        return f"{path}: {show(value)} is not {_TYPE_WORDS[kind]}"
    if kind == "value_error":
        return f"{path}: {str(error['ctx']['error'])}"
    return f"{path}: {show(value)}: {error['msg']}"

"""Lua scripts of the routing layer, read once from the package."""

from __future__ import annotations

from functools import cache
from importlib.resources import files


@cache
def script_source(name: str) -> str:
    return (files("lanes.routing") / "scripts" / f"{name}.lua").read_text()

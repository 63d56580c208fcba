"""The lane's Lua scripts: read once from the package, registered once per client.

Shared helpers live in small ``scripts/lib_<part>.lua`` files. A line
``--! include a b`` in a script (or in a lib file) is replaced by the text of
``lib_a.lua`` and ``lib_b.lua``, each expanded the same way first and each
file included at most once per script. So a script carries only the helpers it
names: every call of a script runs the top level of all it includes (a
closure per ``local function``), and the hot scripts (acquire, release) name
the slow-path helpers only after their fast path, so an uncontended call
creates none of them.

A client gets one redis-py ``Script`` per script name; its ``__call__`` runs
``EVALSHA`` and, on ``NOSCRIPT`` (restart, failover, ``SCRIPT FLUSH``), loads
the script and retries once.
"""

from __future__ import annotations

import functools
import re
import threading
import weakref
from importlib import resources

NAMES = ("acquire", "release", "leave", "renew", "resize", "peek", "provision")

_INCLUDE = re.compile(r"^--! include ([a-z_ ]+)$")


def _read(file: str) -> str:
    return (resources.files("lanes.lane") / "scripts" / file).read_text(encoding="utf-8")


def _expand(body: str, seen: set[str]) -> str:
    out = []
    for line in body.split("\n"):
        found = _INCLUDE.match(line)
        if found is None:
            out.append(line)
            continue
        for part in found.group(1).split():
            if part not in seen:
                seen.add(part)
                out.append(_expand(_read(f"lib_{part}.lua"), seen).rstrip("\n"))
    return "\n".join(out)


@functools.cache
def script_text(name: str) -> str:
    if name not in NAMES:
        raise KeyError(f"no lane script {name!r} (known: {', '.join(NAMES)})")
    return _expand(_read(f"{name}.lua"), set())


_registered: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def scripts_for(client) -> dict:
    """``{name: Script}`` registered on ``client`` (sync, asyncio or cluster)."""
    with _lock:
        found = _registered.get(client)
        if found is None:
            found = {name: client.register_script(script_text(name)) for name in NAMES}
            _registered[client] = found
        return found

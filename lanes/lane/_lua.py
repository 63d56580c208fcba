"""The lane's Lua scripts: read once from the package, registered once per client.

Each ``scripts/<name>.lua`` is prefixed with ``scripts/lib.lua`` (shared
helpers) when read. A client gets one redis-py ``Script`` per script name; its
``__call__`` runs ``EVALSHA`` and, on ``NOSCRIPT`` (restart, failover,
``SCRIPT FLUSH``), loads the script and retries once.
"""

from __future__ import annotations

import functools
import threading
import weakref
from importlib import resources

NAMES = ("acquire", "release", "leave", "renew", "resize", "peek", "provision")


@functools.cache
def script_text(name: str) -> str:
    if name not in NAMES:
        raise KeyError(f"no lane script {name!r} (known: {', '.join(NAMES)})")
    folder = resources.files("lanes.lane") / "scripts"
    lib = (folder / "lib.lua").read_text(encoding="utf-8")
    body = (folder / f"{name}.lua").read_text(encoding="utf-8")
    return f"{lib}\n{body}"


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

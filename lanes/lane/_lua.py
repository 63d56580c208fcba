"""The lane's Lua scripts: read once from the package, registered once per client.

Shared helpers live in small ``scripts/lib_<part>.lua`` files. A line
``--! include a b`` in a script (or in a lib file) is replaced by the text of
``lib_a.lua`` and ``lib_b.lua``, each expanded the same way first and each
file included at most once per script. So a script carries only the helpers it
names: every call of a script runs the top level of all it includes (a
closure per ``local function``), and the hot scripts (acquire, release) name
the slow-path helpers only after their fast path, so an uncontended call
creates none of them.

A client gets one redis-py ``Script`` per script name (``scripts_for``; the
asyncio lane calls them, whose ``__call__`` runs ``EVALSHA`` and, on
``NOSCRIPT`` (restart, failover, ``SCRIPT FLUSH``), loads the script and
retries once). The sync lane calls them through one :class:`SyncRunner` per
client (``runner_for``), which does the same on a leaner path.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import weakref
from importlib import resources

from redis.connection import BlockingConnectionPool, ConnectionPool

try:  # redis-py's packer when hiredis is installed (redis[hiredis], a dependency)
    from redis.connection import HiredisRespSerializer
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - a client without hiredis packs through redis-py
    HiredisRespSerializer = _hiredis_pack = None
from redis.exceptions import ConnectionError, NoScriptError, ResponseError, TimeoutError

from lanes.lane.base import is_cluster

class ReplyLost(ConnectionError):
    """A script call was sent but its reply never came (a timeout or a broken
    connection after the send): the script may or may not have run. Never
    re-sent blindly; the lane decides (see ``Lane._run``)."""


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


KEEP_IDLE = 4          # connections a runner keeps checked out while idle (more go back)
MIN_POOL_ROOM = 32     # ... and only on pools of at least this many (KEEP_IDLE is then <= 1/8)


class SyncRunner:
    """Runs the lane scripts of one sync client: ``EVALSHA`` with the cached
    sha, ``NOSCRIPT`` reloading and retrying once.

    On a plain ``redis.Redis`` (not Cluster, not a single-connection client)
    the call skips redis-py's per-command wrapper (``execute_command``: pool
    checkout with a readiness poll, retry closure, metric recording, pool
    release; ~30 us per call on the benchmark machine) and talks on
    connections it keeps checked out of the client's pool in a small free
    list (taken and returned with atomic list operations; at most
    ``KEEP_IDLE`` idle, and only on a plain or blocking pool of at least
    ``MIN_POOL_ROOM`` connections; redis-py 8's default is 100). A connection
    that fails before the command was wholly sent is dropped (disconnected and
    given back to the pool) and the call goes through ``execute_command``
    (Redis never runs a partial command). One that fails after the send, while
    waiting for the reply, is dropped and :class:`ReplyLost` is raised: the
    script may have run, so it is not sent again here. After a fork the child's runners drop their
    lists (the child must not share the parent's sockets; an
    ``os.register_at_fork`` hook, so no call pays a ``getpid``).
    """

    def __init__(self, client, scripts: dict) -> None:
        self._client = weakref.ref(client)  # the runner is kept in a WeakKeyDictionary by client
        self.scripts = scripts
        pool = getattr(client, "connection_pool", None)
        # Only a plain or blocking pool with room to spare (KEEP_IDLE sit
        # outside it; a Sentinel pool checks who owns a connection, so it
        # uses execute_command).
        # Also no client-side cache: its connections keep the cache's books on
        # every command, which the direct path would bypass.
        # RESP2 and RESP3 (redis-py 8's default) alike: replies are read with
        # the connection's read_response, which handles RESP3 pushes.
        self._pool = pool if (type(pool) in (ConnectionPool, BlockingConnectionPool)
                              and getattr(client, "connection", None) is None
                              and getattr(pool, "max_connections", 0) >= MIN_POOL_ROOM
                              and getattr(pool, "cache", None) is None) else None
        self._free: list = []
        self._cluster = is_cluster(client)
        _all_runners.add(self)

    def __call__(self, name: str, keys: list, args: list):
        """Run a script; the server's run_id (lib_base.lua RUN) is appended
        as the last ARGV."""
        script = self.scripts[name]
        try:
            return self._evalsha(script.sha, keys, args)
        except NoScriptError:
            script.sha = self._client().script_load(script.script)
            return self._evalsha(script.sha, keys, args)

    def _fallback(self, sha: str, keys: list, args: list):
        """One checkout of the client's pool for this call (a bounded or
        Sentinel pool, or after a failure on the kept connections), with the
        run_id of the server the connection reached. Cluster: a connection of
        the node that serves the lane's slot (see ``_on_slot_node``)."""
        client = self._client()
        if self._cluster:
            return self._on_slot_node(client, sha, keys, args)
        pool = getattr(client, "connection_pool", None)
        if pool is None or getattr(client, "connection", None) is not None:
            # A single-connection client: its one connection is its own.
            return client.execute_command("EVALSHA", sha, len(keys), *keys, *args, "")
        return call_with_run(pool, sha, keys, args)

    def _on_slot_node(self, client, sha: str, keys: list, args: list):
        """A Cluster call on a connection of the node that owns the lane's
        slot, so the run_id sent is that node's (a failover to a replica, or
        a node restarted from an older snapshot, is detected as on one
        server). A node that cannot be reached before the send, or that
        answers MOVED/ASK (the slot moved: the script did not run), makes
        the client reread the slot table once; a second miss is an error."""
        for attempt in (1, 2):
            node = client.get_node_from_key(keys[0])
            try:
                return call_with_run(node.redis_connection.connection_pool, sha, keys, args)
            except ReplyLost:
                raise
            except (ConnectionError, TimeoutError, OSError, ResponseError) as exc:
                moved = isinstance(exc, ResponseError) and str(exc).split(" ", 1)[0] in ("MOVED", "ASK")
                if attempt == 2 or not (moved or not isinstance(exc, ResponseError)):
                    raise
                client.nodes_manager.initialize()

    def _evalsha(self, sha: str, keys: list, args: list):
        pool = self._pool
        if pool is None:
            return self._fallback(sha, keys, args)
        try:
            conn = self._free.pop()
        except IndexError:
            conn = None
        if conn is None:
            try:
                conn = pool.get_connection()
            except (ConnectionError, TimeoutError, OSError):
                return self._fallback(sha, keys, args)
        clean = sent = False
        try:
            if conn._sock is not getattr(conn, "_lanes_sock", None):
                _learn_run(conn)
            with_run = (*args, conn._lanes_run)
            if _hiredis_pack is not None and type(getattr(conn, "_command_packer", None)) is HiredisRespSerializer:
                # What that packer does, minus its per-argument type checks
                # (our arguments are str and int only).
                packed = _hiredis_pack(("EVALSHA", sha, len(keys), *keys, *with_run))
                sock = conn._sock
                if sock is not None and not conn.health_check_interval:
                    # send_packed_command's own work when connected with no
                    # health checks due; a failure is handled below as its
                    # ConnectionError would be.
                    sock.sendall(packed)
                else:
                    conn.send_packed_command((packed,))
            else:
                conn.send_command("EVALSHA", sha, len(keys), *keys, *with_run)
            sent = True
            try:
                reply = conn.read_response()
            except ResponseError:
                clean = True  # a whole error reply was read: the connection is fine
                raise
            clean = True
        except (ConnectionError, TimeoutError, OSError) as exc:
            # Dropped below. Not sent: the client's own path (retry policy,
            # reconnect) takes over. Sent: the reply is lost, the caller decides.
            failure = exc
        finally:
            if clean and len(self._free) < KEEP_IDLE:
                self._free.append(conn)
            elif clean:
                pool.release(conn)
            else:
                try:
                    conn.disconnect()
                finally:
                    pool.release(conn)
        if clean:
            return reply
        if sent:
            raise ReplyLost(f"no reply to a lane script call: {failure}") from failure
        return self._fallback(sha, keys, args)

    def close(self) -> None:
        """Give the kept connections back to the pool."""
        free, self._free = self._free, []
        if self._pool is None:
            return
        for conn in free:
            self._pool.release(conn)


_RUN_ID = re.compile(rb"^run_id:([0-9a-f]+)\r?$", re.MULTILINE)


def run_id_of(info) -> str:
    """The run_id in a raw ``INFO server`` reply ('' if absent)."""
    found = _RUN_ID.search(info if isinstance(info, bytes) else str(info).encode())
    return found.group(1).decode() if found else ""


def _learn_run(conn) -> None:
    """Ask the server this connection reached for its run_id (once per
    socket: a reconnect may reach another server process). Kept on the
    connection; '' when INFO is not allowed (the scripts then skip the check)."""
    conn.send_command("INFO", "server")
    try:
        run = run_id_of(conn.read_response())
    except ResponseError:
        run = ""
    conn._lanes_run = run
    conn._lanes_sock = conn._sock


def call_with_run(pool, sha: str, keys: list, args: list):
    """One ``EVALSHA`` on a connection checked out of ``pool`` for this call,
    with the run_id of the server it reached as the last ARGV. A failure after
    the send raises :class:`ReplyLost` (never re-sent); one before it (a
    connection the server closed, e.g. at a restart) is tried once more on a
    fresh connection: nothing ran."""
    for attempt in (1, 2):
        try:
            return _call_once(pool, sha, keys, args)
        except ReplyLost:
            raise
        except (ConnectionError, TimeoutError, OSError):
            if attempt == 2:
                raise


class _Checkout:
    """One script call on a connection checked out for it. After a whole
    reply (an error reply too) the connection goes back as it is; after any
    other failure it is dropped first, and an I/O failure after the send
    (``sent``) is a lost reply: :class:`ReplyLost`, never sent again here."""

    def __init__(self, pool, conn) -> None:
        self.pool, self.conn, self.sent = pool, conn, False

    def _outcome(self, exc) -> tuple[bool, Exception | None]:
        """(clean, the ReplyLost to raise instead of ``exc``, if any)."""
        if exc is None or isinstance(exc, ResponseError):
            return True, None
        if self.sent and isinstance(exc, (ConnectionError, TimeoutError, OSError)):
            return False, ReplyLost(f"no reply to a lane script call: {exc}")
        return False, None

    def __enter__(self) -> "_Checkout":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        clean, lost = self._outcome(exc)
        try:
            if not clean:
                self.conn.disconnect()
        finally:
            self.pool.release(self.conn)
        if lost is not None:
            raise lost from exc
        return False

    async def __aenter__(self) -> "_Checkout":
        return self

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        clean, lost = self._outcome(exc)
        try:
            if not clean:
                await self.conn.disconnect()
        finally:
            await self.pool.release(self.conn)
        if lost is not None:
            raise lost from exc
        return False


def _call_once(pool, sha: str, keys: list, args: list):
    conn = pool.get_connection()
    with _Checkout(pool, conn) as call:
        if conn._sock is None or conn._sock is not getattr(conn, "_lanes_sock", None):
            conn.connect()
            _learn_run(conn)
        conn.send_command("EVALSHA", sha, len(keys), *keys, *args, conn._lanes_run)
        call.sent = True
        return conn.read_response()


async def acall_with_run(pool, sha: str, keys: list, args: list):
    """:func:`call_with_run` for an asyncio pool (the asyncio lane's only
    path: one checkout per call, as redis-py's own ``execute_command``). A
    connection that fails before the send (one the server closed, e.g. at a
    restart) is replaced once: nothing ran on it."""
    for attempt in (1, 2):
        try:
            return await _acall_once(pool, sha, keys, args)
        except ReplyLost:
            raise
        except (ConnectionError, TimeoutError, OSError):
            if attempt == 2:
                raise


async def _acall_once(pool, sha: str, keys: list, args: list):
    conn = await pool.get_connection()
    async with _Checkout(pool, conn) as call:
        if conn._writer is None or conn._writer is not getattr(conn, "_lanes_sock", None):
            await conn.connect()
            await conn.send_command("INFO", "server")
            try:
                conn._lanes_run = run_id_of(await conn.read_response())
            except ResponseError:
                conn._lanes_run = ""
            conn._lanes_sock = conn._writer
        await conn.send_command("EVALSHA", sha, len(keys), *keys, *args, conn._lanes_run)
        call.sent = True
        return await conn.read_response()


_runners: weakref.WeakKeyDictionary[object, SyncRunner] = weakref.WeakKeyDictionary()
_all_runners: "weakref.WeakSet[SyncRunner]" = weakref.WeakSet()


def _forget_parent_connections() -> None:
    # In a forked child: the kept connections' sockets are the parent's.
    for runner in list(_all_runners):
        runner._free = []


os.register_at_fork(after_in_child=_forget_parent_connections)


def runner_for(client) -> SyncRunner:
    """The :class:`SyncRunner` of a sync ``client`` (one per client)."""
    with _lock:
        found = _runners.get(client)
    if found is None:
        scripts = scripts_for(client)
        with _lock:
            found = _runners.get(client)
            if found is None:
                found = _runners[client] = SyncRunner(client, scripts)
    return found


def close_runner(client) -> None:
    with _lock:
        found = _runners.pop(client, None)
    if found is not None:
        found.close()

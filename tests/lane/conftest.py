"""Fixtures of the lane tests: clients with their hubs closed after each test,
private redis-server processes (restart tests) and a local 3-node Cluster."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio

from lanes.embedded import EmbeddedRedis, free_port, redis_server_binary
from lanes.lane import AsyncLane, Lane
from lanes.lane.hub import close_hubs


@pytest.fixture
def make_lane(redis_url):
    """Build sync lanes on a clean database of each Redis under test."""
    clients = []

    def build(key: str = "pool:test", *, width=2, lease_seconds: float = 5.0, renew_seconds=None,
              client=None, provision: bool = True, **kwargs) -> Lane:
        if client is None:
            client = redis.Redis.from_url(redis_url, socket_timeout=5)
            clients.append(client)
        lane = Lane(client, key, width=width, lease_seconds=lease_seconds, renew_seconds=renew_seconds, **kwargs)
        if provision:
            lane.provision()
        lane.make_url = redis_url  # for a test's child process to reach the same database
        return lane

    build.url = redis_url
    yield build
    for client in clients:
        close_hubs(client)
        client.close()


@pytest.fixture
async def make_async_lane(redis_url):
    clients = []
    lanes = []

    async def build(key: str = "pool:test", *, width=2, lease_seconds: float = 5.0, renew_seconds=None,
                    provision: bool = True) -> AsyncLane:
        client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=5)
        clients.append(client)
        lane = AsyncLane(client, key, width=width, lease_seconds=lease_seconds, renew_seconds=renew_seconds)
        lanes.append(lane)
        if provision:
            await lane.provision()
        return lane

    yield build
    for lane in lanes:
        await lane.close()
    for client in clients:
        await client.aclose()


@pytest.fixture
def private_redis(tmp_path):
    """A redis-server of the test's own (no persistence: a kill loses its state) on a free port."""
    server = EmbeddedRedis(tmp_path / "private-redis", port=free_port(), extra_args=("--appendonly", "no"))
    server.ensure()
    yield server
    server.stop()


def _cluster_port() -> int:
    """A free port whose cluster-bus port (port + 10000) is free and valid too."""
    import random
    import socket

    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 40000)
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


def _wait_listening(port: int, within: float = 10.0) -> None:
    import socket

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"cluster node on port {port} did not start")


class LocalCluster:
    """Three redis-server processes in cluster mode on loopback ports."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ports = [_cluster_port() for _ in range(3)]
        self.procs: list[subprocess.Popen] = []

    def _spawn(self, port: int) -> subprocess.Popen:
        return subprocess.Popen(
            [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
             "--cluster-config-file", "nodes.conf", "--dir", str(self.folder / str(port)), "--save", "",
             "--appendonly", "no", "--maxmemory-policy", "noeviction"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def restart(self, port: int) -> None:
        """SIGKILL one node and start it again on its folder: it keeps its
        slots (nodes.conf) and loads the snapshot a SAVE left there, if any."""
        index = self.ports.index(port)
        self.procs[index].kill()
        self.procs[index].wait(timeout=10)
        self.procs[index] = self._spawn(port)
        _wait_listening(port)

    def start(self) -> None:
        for port in self.ports:
            (self.folder / str(port)).mkdir(parents=True)
            self.procs.append(self._spawn(port))
        for port in self.ports:
            _wait_listening(port)
        clients = [redis.Redis(port=port, socket_timeout=5) for port in self.ports]
        # 16384 slots split in three ranges; then every node meets the first.
        bounds = [0, 5461, 10923, 16384]
        for index, client in enumerate(clients):
            client.execute_command("CLUSTER ADDSLOTS", *range(bounds[index], bounds[index + 1]))
        for port in self.ports[1:]:
            clients[0].execute_command("CLUSTER MEET", "127.0.0.1", port)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            infos = [client.execute_command("CLUSTER", "INFO") for client in clients]
            texts = [str(info) for info in infos]
            if all("cluster_state:ok" in t or "'cluster_state': 'ok'" in t for t in texts):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("local cluster did not reach cluster_state:ok in 30 s")
        for client in clients:
            client.close()

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def local_cluster(tmp_path):
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def fault_proxy(redis_url):
    """A :class:`tests.lane.faultproxy.FaultProxy` in front of each Redis under
    test; ``proxy.client_url`` reaches the same database through it."""
    from urllib.parse import urlparse

    from tests.lane.faultproxy import FaultProxy

    parsed = urlparse(redis_url)
    proxy = FaultProxy(parsed.hostname or "127.0.0.1", parsed.port or 6379)
    db = int((parsed.path or "/0").strip("/") or 0)
    proxy.client_url = proxy.url(db)
    proxy.direct_url = redis_url
    yield proxy
    proxy.close()

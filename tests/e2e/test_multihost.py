"""More than one machine, on one machine (issue 33): network namespaces joined
by veth pairs to a bridge (Debian's iproute2), so every part reaches the others
only over its own network interface, as separate hosts do.

    switch ns : bridge br0
    redis ns  : 10.33.<n>.1   redis-server (lanes, broker, results; AOF)
    w1 ns     : 10.33.<n>.2   fleet worker (supervisor and its processes)
    w2 ns     : 10.33.<n>.3   fleet worker
    sim ns    : 10.33.<n>.4   lanes sim
    client ns : 10.33.<n>.5   the load: submits and reads results

Mid-load, worker host w1 is cut off the network (its link taken down) and
brought back: the width is never exceeded, its slots come back, its work
completes elsewhere, nothing accepted is lost. The catalog is a SQLite file
both worker hosts read from the one disk they share here (across real
machines: PostgreSQL, docs/DEPLOYMENT.md "Across machines").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lanes.catalog import apply_document, open_catalog
from lanes.settings import Settings
from tests.conftest import missing_service

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

WIDTH = 2
HOSTS = {"redis": 1, "w1": 2, "w2": 3, "sim": 4, "client": 5}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


class Network:
    """Namespaces named after this test's process, one bridge, a veth per host."""

    def __init__(self) -> None:
        if shutil.which("ip") is None or os.geteuid() != 0:
            missing_service("the multi-host test needs iproute2 and root (ip netns)")
        self.tag = f"l{os.getpid() % 100000}"
        self.subnet = 33 + os.getpid() % 200
        self.switch = f"{self.tag}-sw"
        self.created: list[str] = []
        self._add(self.switch)
        self.run_in(self.switch, "ip", "link", "add", "br0", "type", "bridge")
        self.run_in(self.switch, "ip", "link", "set", "br0", "up")
        for host, number in HOSTS.items():
            ns = self.ns(host)
            self._add(ns)
            inner, outer = f"{self.tag}{number}a", f"{self.tag}{number}b"
            _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "netns", self.switch)
            self.run_in(self.switch, "ip", "link", "set", outer, "master", "br0")
            self.run_in(self.switch, "ip", "link", "set", outer, "up")
            self.run_in(ns, "ip", "addr", "add", f"{self.address(host)}/24", "dev", inner)
            self.run_in(ns, "ip", "link", "set", inner, "up")
            self.run_in(ns, "ip", "link", "set", "lo", "up")

    def _add(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self.created.append(ns)

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def address(self, host: str) -> str:
        return f"10.{self.subnet}.0.{HOSTS[host]}"

    def run_in(self, ns: str, *command: str, env: dict | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run(["ip", "netns", "exec", ns, *command], capture_output=True, text=True, timeout=120,
                              env=env)
        assert done.returncode == 0, f"{command}: {done.stdout} {done.stderr}"
        return done

    def spawn(self, host: str, command: list[str], env: dict, log: Path) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.ns(host), *command], env=env,
                                stdout=log.open("w"), stderr=subprocess.STDOUT)

    def cut(self, host: str, up: bool) -> None:
        """Take ``host``'s link down (cut off the network) or bring it back."""
        outer = f"{self.tag}{HOSTS[host]}b"
        self.run_in(self.switch, "ip", "link", "set", outer, "up" if up else "down")

    def close(self) -> None:
        for ns in reversed(self.created):
            _ip("netns", "del", ns, check=False)


DRIVER = textwrap.dedent('''
    import json, os, sys, time
    from lanes.routing.client import LanesClient
    from lanes.settings import load_settings
    count, phase_file = int(sys.argv[1]), sys.argv[2]
    client = LanesClient(load_settings())
    chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    ids = []
    for number in range(count):
        workflow = ("dialog", "notes")[number % 2]
        ids.append(client.submit(workflow, chat, deadline=None if workflow == "notes" else 600).id)
        time.sleep(0.1)
    open(phase_file, "w").write("submitted")
    submitted_at = time.time()
    states, seen_at = {}, {}
    give_up = time.monotonic() + 600
    while len(states) < len(ids) and time.monotonic() < give_up:
        for task_id in ids:
            if task_id not in states:
                report = client.wait(task_id, 0.01)
                if report is not None:
                    states[task_id] = report
                    seen_at[task_id] = time.time()
        time.sleep(0.5)
    for _ in range(240):  # the cut's times are written once the host is back
        if os.path.exists(phase_file + ".cut"):
            break
        time.sleep(0.5)
    cut = [float(x) for x in open(phase_file + ".cut").read().split()] if os.path.exists(phase_file + ".cut") else []
    print(json.dumps({
        "submitted": len(ids),
        "answered": sum(1 for r in states.values() if r["state"] == "SUCCESS"),
        "failed": sorted(r["error"]["type"] for r in states.values() if r["state"] != "SUCCESS"),
        "lost": [t for t in ids if t not in states],
        "timeline": {"submitted": submitted_at - cut[0] if cut else None,
                     "first_seen": min(seen_at.values()) - cut[0] if cut and seen_at else None,
                     "last_seen": max(seen_at.values()) - cut[0] if cut and seen_at else None,
                     "cut_seconds": cut[1] - cut[0] if cut else None},
        "answered_while_cut_off": sum(1 for t, at in seen_at.items()
                                      if cut and cut[0] <= at <= cut[1] and states[t]["state"] == "SUCCESS"),
    }))
''')


PRESENCE = textwrap.dedent('''
    import json, redis
    from lanes.presence import WorkerPresence
    from lanes.settings import load_settings
    settings = load_settings()
    print(json.dumps(WorkerPresence(redis.Redis.from_url(settings.redis_url), prefix=settings.key_prefix).live("gpu")))
''')


def _wait_for_both_hosts(network: Network, env: dict, timeout: float = 240.0) -> None:
    """Until both worker hosts' heartbeats are in Redis (bounded)."""
    give_up = time.monotonic() + timeout
    names: list[str] = []
    while time.monotonic() < give_up:
        try:
            names = json.loads(network.run_in(network.ns("client"), sys.executable, "-c", PRESENCE,
                                              env=env).stdout.strip().splitlines()[-1])
        except (AssertionError, ValueError, IndexError):
            names = []
        if all(any(f"{network.tag}-{host}" in name for name in names) for host in ("w1", "w2")):
            return
        time.sleep(2.0)
    raise AssertionError(f"both worker hosts did not come up within {timeout}s: {names}")


@pytest.fixture
def network():
    net = Network()
    yield net
    net.close()


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def test_a_worker_host_cut_off_mid_load_loses_nothing_and_never_overloads(network, tmp_path):
    redis_url = f"redis://{network.address('redis')}:6379/0"
    sim_port = 8700
    base_url = f"http://{network.address('sim')}:{sim_port}/v1"
    catalog = tmp_path / "catalog.db"
    settings = Settings(state_dir=tmp_path / "state", redis_url=redis_url, database_url=f"sqlite:///{catalog}")
    engine = open_catalog(settings)
    apply_document(engine, {
        "pools": [{"name": "gpu", "width": WIDTH}],
        "models": [{"name": "m", "base_url": base_url, "pool": "gpu", "timeout_ms": 5_000}],
        "workflows": [{"name": "dialog", "priority": "interactive", "candidates": ["m"]},
                      {"name": "notes", "priority": "background", "candidates": ["m"]}],
    })
    engine.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANES_") or k.startswith("LANES_TEST_")}
    env.update(LANES_REDIS_URL=redis_url, LANES_DATABASE_URL=f"sqlite:///{catalog}", LANES_LEASE_SECONDS="3",
               LANES_VISIBILITY_TIMEOUT_SECONDS="60", LANES_REDIS_TIMEOUT_SECONDS="2",
               LANES_BACKGROUND_RETRY_SECONDS="1", LANES_BACKGROUND_RETRY_CAP_SECONDS="4")
    procs: list[subprocess.Popen] = []
    try:
        redis_dir = tmp_path / "redis"
        redis_dir.mkdir()
        procs.append(network.spawn("redis", [shutil.which("redis-server") or "redis-server",
                                             "--bind", network.address("redis"), "--port", "6379",
                                             "--protected-mode", "no", "--appendonly", "yes",
                                             "--maxmemory-policy", "noeviction", "--dir", str(redis_dir)],
                                   env, tmp_path / "redis.log"))
        procs.append(network.spawn("sim", [sys.executable, "-m", "lanes.cli", "sim", "--host",
                                           network.address("sim"), "--port", str(sim_port), "--model", "m:16:300"],
                                   env, tmp_path / "sim.log"))
        time.sleep(3.0)
        network.run_in(network.ns("client"), sys.executable, "-m", "lanes.cli", "pools", "provision",
                       env=dict(env, LANES_STATE_DIR=str(tmp_path / "client")))
        for host in ("w1", "w2"):
            host_env = dict(env, LANES_STATE_DIR=str(tmp_path / host))
            # A host name of its own (a UTS namespace), as separate machines have: worker names differ.
            command = f"hostname {network.tag}-{host} && exec {sys.executable} -m workers.supervisor --fleet gpu " \
                      "--poll-seconds 1"
            procs.append(network.spawn(host, ["unshare", "--uts", "sh", "-c", command], host_env,
                                       tmp_path / f"{host}.log"))
        _wait_for_both_hosts(network, dict(env, LANES_STATE_DIR=str(tmp_path / "client")))

        phase = tmp_path / "phase"
        driver = subprocess.Popen(["ip", "netns", "exec", network.ns("client"), sys.executable, "-c", DRIVER,
                                   "60", str(phase)], env=dict(env, LANES_STATE_DIR=str(tmp_path / "client")),
                                  stdout=subprocess.PIPE, stderr=(tmp_path / "driver.log").open("w"), text=True)
        time.sleep(3.0)
        network.cut("w1", up=False)            # the host drops off the network mid-load
        cut_at = time.time()
        time.sleep(20.0)                       # several leases: its slots must come back meanwhile
        network.cut("w1", up=True)
        Path(f"{phase}.cut").write_text(f"{cut_at} {time.time()}")
        out, _ = driver.communicate(timeout=700)
        report = json.loads(out.strip().splitlines()[-1])

        stats = json.loads(network.run_in(network.ns("client"), "python3", "-c", (
            "import json, urllib.request; print(urllib.request.urlopen("
            f"'http://{network.address('sim')}:{sim_port}/admin/stats').read().decode())")).stdout)
        report["peak_in_flight"] = stats["m"]["max_in_flight"]
        report["width"] = WIDTH
        print("multi-host report:", json.dumps(report, sort_keys=True))

        assert report["lost"] == [], report
        assert report["peak_in_flight"] <= WIDTH, report
        assert report["answered"] >= report["submitted"] // 2, report
        # Its slots came back and the other host served while it was away.
        assert report["answered_while_cut_off"] > 0, report
    finally:
        for proc in reversed(procs):
            _stop(proc)

"""What the routing benchmarks share: the catalog, a deployment per scenario,
the plain-Celery baseline, and small helpers for waiting and percentiles."""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import redis

from lanes.celery_client import make_celery
from lanes.settings import Settings
from tests.e2e.harness import RemoteSim, deploy

ROOT = Path(__file__).resolve().parent.parent

PLAIN_TASK = "bench.plain_call"
CHAT = {"messages": [{"role": "user", "content": "bench"}], "max_tokens": 1}
W = 4


def catalog(width: int) -> dict:
    return {
        "pools": [{"name": "p", "width": width, "ceiling": max(width, 64)}],
        "models": [{"name": "m", "base_url": "{sim}", "pool": "p", "timeout_ms": 120_000}],
        "workflows": [
            {"name": "tool", "priority": "user_tool", "candidates": ["m"]},
            {"name": "inter", "priority": "interactive", "candidates": ["m"]},
            {"name": "bg", "priority": "background", "candidates": ["m"]},
        ],
    }


class Bench:
    # Redis's 16 databases (0 left alone), reused in turn: each deployment is
    # closed before the next one starts, and each starts on a flushed database.
    DATABASES = 15

    def __init__(self, base_url: str, work: Path) -> None:
        self.base_url = base_url
        self.work = work
        self._made = 0

    def next_url(self) -> str:
        self._made += 1
        url = f"{self.base_url}/{(self._made - 1) % self.DATABASES + 1}"
        redis.Redis.from_url(url).flushdb()
        return url

    def deploy(self, sim: RemoteSim, width: int, **settings):
        url = self.next_url()
        return deploy(self.work / f"d{self._made}", url, catalog(width), sim, ["p"], **settings)

    def plain(self, sim: RemoteSim, concurrency: int, queue: str = "plain") -> "Plain":
        return Plain(self.next_url(), self.work, concurrency, queue)


class Plain:
    """The baseline: plain Celery tasks on one FIFO queue, calling the simulator."""

    def __init__(self, redis_url: str, work: Path, concurrency: int, queue: str) -> None:
        self.settings = Settings(state_dir=work / "plain", redis_url=redis_url)
        # kombu's own transport: plain Celery.
        self.app = make_celery(self.settings, redis_url, main="plain-client", kombu_transport=True)
        self.queue = queue
        env = {"LANES_REDIS_URL": redis_url, "LANES_STATE_DIR": str(work / "plain"), "PATH": "/usr/bin:/bin"}
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "plain_worker.py"), "--concurrency", str(concurrency), "--queue", queue],
            env=env, cwd=ROOT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.app.control.ping(timeout=0.5):
                return
        raise RuntimeError("plain worker did not start")

    def submit(self, sim: RemoteSim):
        return self.app.send_task(PLAIN_TASK, args=[sim.base_url, "m", CHAT], queue=self.queue)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.app.close()


def wait_ready(results, timeout: float = 600.0, poll: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    pending = list(results)
    while pending and time.monotonic() < deadline:
        pending = [r for r in pending if not r.ready()]
        if pending:
            time.sleep(poll)
    if pending:
        raise RuntimeError(f"{len(pending)} tasks did not finish")
    failed = [r for r in results if not r.successful()]
    if failed:
        raise RuntimeError(f"{len(failed)} tasks failed, e.g. {failed[0].result!r}")


def p(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


class ClosedLoop:
    """``clients`` threads, each submitting one task and waiting for it, again and again."""

    def __init__(self, submit, clients: int) -> None:
        self._submit = submit
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            result = self._submit()
            while not self._stop.is_set() and not result.ready():
                time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def settle(sim: RemoteSim, predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate(sim.stats()["m"]):
        time.sleep(0.05)

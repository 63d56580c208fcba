"""What the routing benchmarks share: the catalog, a deployment per scenario,
the plain-Celery baseline, and small helpers for waiting and percentiles."""

from __future__ import annotations

import multiprocessing
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import redis
from celery.states import READY_STATES

from lanes.celery_client import make_celery
from lanes.routing.client import LanesClient
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


def fleet_threads(dep, *, background: bool = False) -> int:
    """The threads the deployment's fleet would run for one of its two queues
    on the threads pool (workers/fleet.py's plan: two per slot, within its
    bounds). Plain Celery's baseline gets as many, so that a ratio against it
    measures routing, not extra threads (issue 41: like with like); on the
    gevent pool the fleet holds up to ``fleet_held_messages`` green threads
    a queue, and the lane's width, not that bound, is what admits calls."""
    from lanes.catalog import load_routing, open_catalog
    from workers.fleet import plan_fleet

    threads = dep.settings.model_copy(update={"fleet_pool": "threads"})
    plan = plan_fleet(load_routing(open_catalog(dep.settings, create=False)), "p", threads)
    return plan.background_held if background else plan.foreground_held


class Plain:
    """The baseline: plain Celery tasks on one FIFO queue, calling the simulator."""

    def __init__(self, redis_url: str, work: Path, concurrency: int, queue: str) -> None:
        self.redis_url = redis_url
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


@dataclass(frozen=True)
class LanesLoad:
    """Routed submits of ``workflow``, rebuilt in the load's own process."""

    state_dir: str
    redis_url: str
    database_url: str
    workflow: str

    @classmethod
    def of(cls, dep, workflow: str) -> "LanesLoad":
        return cls(str(dep.settings.state_dir), dep.redis_url, dep.settings.catalog_url(), workflow)

    def submitter(self):
        settings = Settings(state_dir=Path(self.state_dir), redis_url=self.redis_url, database_url=self.database_url)
        client = LanesClient(settings, redis_url=self.redis_url)
        return lambda: client.submit(self.workflow, CHAT)


@dataclass(frozen=True)
class PlainLoad:
    """Plain Celery submits to the baseline's queue, rebuilt in the load's own process."""

    redis_url: str
    state_dir: str
    queue: str
    sim_url: str

    @classmethod
    def of(cls, plain: "Plain", sim: RemoteSim) -> "PlainLoad":
        return cls(plain.redis_url, str(plain.settings.state_dir), plain.queue, sim.base_url)

    def submitter(self):
        settings = Settings(state_dir=Path(self.state_dir), redis_url=self.redis_url)
        app = make_celery(settings, self.redis_url, main="plain-load", kombu_transport=True)
        return lambda: app.send_task(PLAIN_TASK, args=[self.sim_url, "m", CHAT], queue=self.queue)


def _closed_loop(load, clients: int, stop) -> None:
    submit = load.submitter()
    outstanding = [submit() for _ in range(clients)]
    backend = outstanding[0].backend
    while not stop.wait(0.02):
        # One MGET for every client's task: the load costs the same however many
        # clients it has, so a backlog's clients do not load the machine more
        # than a handful do (a poll per client was 2,200 reads/s at 44 clients).
        values = backend.mget([backend.get_key_for_task(r.id) for r in outstanding])
        outstanding = [
            submit() if value is not None and backend.decode_result(value)["status"] in READY_STATES else r
            for r, value in zip(outstanding, values)
        ]


class ClosedLoop:
    """``clients`` clients, each submitting one task and, once it is done (seen
    within 20 ms), the next, again and again.

    They run in a process of their own, so the measuring process publishes and
    reads its samples without the load's threads in its way.
    """

    def __init__(self, load: "LanesLoad | PlainLoad", clients: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._process = context.Process(target=_closed_loop, args=(load, clients, self._stop), daemon=True)
        self._process.start()

    def stop(self) -> None:
        """Stop the load; raise if it died before (its samples timed an idle lane)."""
        self._stop.set()
        self._process.join(60)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(10)
        if self._process.exitcode != 0:
            raise RuntimeError(f"the closed-loop load ended with exit code {self._process.exitcode}")


def settle(sim: RemoteSim, predicate, timeout: float = 30.0, *, what: str | None = None) -> None:
    """Wait until the simulator's stats satisfy ``predicate``; with ``what``,
    raise if they never do (a figure taken then would measure the wrong state)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate(sim.stats()["m"]):
            return
        time.sleep(0.05)
    if what is not None:
        raise RuntimeError(f"{what} not reached within {timeout:.0f}s: {sim.stats()['m']}")

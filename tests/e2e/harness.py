"""A whole Lanes deployment on one machine, for end-to-end tests and benchmarks.

Real parts only: a Redis server, a SQLite catalog, the HTTP simulator, and
one supervised Celery worker process per fleet, talking over sockets.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from lanes.catalog import apply_document, load_routing, open_catalog
from lanes.lane import Lane
from lanes.routing.client import LanesClient
from lanes.routing.runtime import pool_lane, provision_lanes
from lanes.settings import Settings
from lanes.sim import Simulator


class RemoteSim:
    """``lanes sim`` in a process of its own, driven over its admin HTTP API.

    Benchmarks use it so the simulator never shares a GIL with the load.
    """

    def __init__(self, model_specs: list[str], *, extra_args: tuple[str, ...] = ()) -> None:
        from lanes.embedded import free_port

        self.port = free_port()
        args = [sys.executable, "-m", "lanes.cli", "sim", "--port", str(self.port), *extra_args]
        for spec in model_specs:
            args += ["--model", spec]
        self._proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        self._http = httpx.Client(timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                self._http.get(self.url + "/admin/stats").raise_for_status()
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("lanes sim did not start within 30 s")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def start(self) -> "RemoteSim":
        return self

    def stats(self) -> dict:
        return self._http.get(self.url + "/admin/stats").json()

    def calls(self) -> list[dict]:
        return self._http.get(self.url + "/admin/calls").json()

    def configure(self, name: str, **changes) -> dict:
        return self._http.post(f"{self.url}/admin/models/{name}", json=changes).json()

    def reset(self, *, config: bool = False) -> None:
        self._http.post(self.url + "/admin/reset", json={"config": config})

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._http.close()


@dataclass
class Deployment:
    settings: Settings
    redis_url: str
    sim: "Simulator | RemoteSim"
    client: LanesClient
    workers: dict[str, subprocess.Popen] = field(default_factory=dict)
    owns_sim: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)  # more LANES_* settings for the workers

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LANES_") or k.startswith("LANES_TEST_")}
        env.update(
            LANES_STATE_DIR=str(self.settings.state_dir),
            LANES_REDIS_URL=self.redis_url,
            LANES_DATABASE_URL=self.settings.catalog_url(),
            LANES_LEASE_SECONDS=str(self.settings.lease_seconds),
            LANES_EVENTS_ENABLED=str(self.settings.events_enabled).lower(),
            LANES_FLEET_HELD_MESSAGES=str(self.settings.fleet_held_messages),
            LANES_MESSAGE_LEASE_SECONDS=str(self.settings.message_lease_seconds),
            LANES_FLEET_POOL=self.settings.fleet_pool,
            LANES_VISIBILITY_TIMEOUT_SECONDS=str(self.settings.visibility_timeout_seconds),
            LANES_REDIS_TIMEOUT_SECONDS=str(self.settings.redis_timeout_seconds),
        )
        env.update(self.extra_env)
        return env

    def client_events(self, **filters):
        from lanes.routing.events import EventLog

        log = EventLog(redis.Redis.from_url(self.redis_url), prefix=self.settings.key_prefix)
        deadline = time.monotonic() + 2  # events are flushed by the workers every 100 ms
        while True:
            found = log.list(**filters, limit=1000)
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def table(self):
        return load_routing(self.client.engine)

    def lane(self, pool_name: str) -> Lane:
        """The same lane the workers use for this pool."""
        pool = self.table().pools[pool_name]
        return pool_lane(redis.Redis.from_url(self.redis_url), self.settings, pool)

    def start_worker(self, fleet: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers.supervisor", "--fleet", fleet, "--poll-seconds", "0.5"],
            env=self.env,
        )
        self.workers[fleet] = proc
        return proc

    def wait_for_workers(self, fleets, timeout: float = 300.0) -> None:
        # Generous: six supervised fleets took 100-130 s to answer at load 20 on 2 cores.
        wanted = set(fleets)
        deadline = time.monotonic() + timeout
        seen: set[str] = set()
        while time.monotonic() < deadline:
            try:
                replies = self.client.celery.control.ping(timeout=1.0) or []
            except redis.exceptions.ConnectionError:  # a pooled connection an earlier test cut: ask again
                continue
            seen = {name.split("@", 1)[0] for reply in replies for name in reply}
            if wanted <= seen:
                return
            time.sleep(0.2)
        raise RuntimeError(f"workers did not answer within {timeout}s: missing {sorted(wanted - seen)}")

    def worker_children(self, fleet: str) -> list[int]:
        """Process ids of the Celery worker(s) a fleet's supervisor runs now."""
        found = subprocess.run(["pgrep", "-P", str(self.workers[fleet].pid)], capture_output=True, text=True)
        return [int(pid) for pid in found.stdout.split()]

    def stop_worker(self, fleet: str, sig: int = signal.SIGTERM, timeout: float = 90.0) -> int:
        # The supervisor gives calls in flight the fleet's longest timeout to finish.
        proc = self.workers.pop(fleet)
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        proc.send_signal(sig)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            for pid in children:  # never leave a worker behind its killed supervisor
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.kill()
            return proc.wait()

    def close(self) -> None:
        for proc in self.workers.values():
            proc.send_signal(signal.SIGTERM)
        for fleet in list(self.workers):
            self.stop_worker(fleet)
        self.client.close()
        if self.owns_sim:
            self.sim.stop()


def deploy(state_dir: Path, redis_url: str, document: dict, sim_models, fleets,
           *, lease_seconds: float = 10.0, extra_env: dict[str, str] | None = None,
           **settings_overrides) -> Deployment:
    """Apply ``document`` (with ``{sim}`` in base URLs), start the simulator and the fleets' workers.

    ``sim_models`` is a list of SimModel (simulator in this process) or a RemoteSim.
    """
    if isinstance(sim_models, RemoteSim):
        sim = sim_models
    else:
        sim = Simulator(sim_models, host="127.0.0.1", port=0)
        sim.start()
    for model in document.get("models", []):
        model["base_url"] = model["base_url"].replace("{sim}", sim.base_url)
    settings_overrides.setdefault("database_url", f"sqlite:///{state_dir / 'catalog.db'}")
    settings = Settings(
        state_dir=state_dir,
        redis_url=redis_url,
        lease_seconds=lease_seconds,
        **settings_overrides,
    )
    engine = open_catalog(settings)
    apply_document(engine, document)
    provision_lanes(redis.Redis.from_url(redis_url), settings, load_routing(engine))
    deployment = Deployment(settings, redis_url, sim, LanesClient(settings, redis_url=redis_url),
                            owns_sim=not isinstance(sim_models, RemoteSim), extra_env=dict(extra_env or {}))
    try:
        for fleet in fleets:
            deployment.start_worker(fleet)
        deployment.wait_for_workers(fleets)
    except BaseException:
        deployment.close()
        raise
    return deployment

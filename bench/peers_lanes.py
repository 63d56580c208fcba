"""The Lanes arm: the fleet through its public path, with 1..N workers.

The catalog is applied (two pools, a workflow per class with the primary then
the fallback as candidates), the lanes provisioned, and N ``lanes worker
--fleet primary`` processes started as N machines would run them: each in a
UTS namespace of its own with a hostname of its own (``unshare -u``, where
the machine allows it), so their Celery node names differ as on separate
hosts. Requests go in with ``LanesClient.submit``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from peers_celery import process_tree_cpu, run_on_schedule
from peers_workload import CHAT, WIDTH, Outcome, Request

from tests.e2e.harness import RemoteSim, deploy

FLEET = "primary"
WORKFLOW = {"interactive": "dialog", "background": "memory"}
RESERVE_MS = 500  # the fallback's share of a deadline (2.5 calls): the primary may be waited for until then


def catalog() -> dict:
    return {
        "pools": [{"name": name, "width": WIDTH} for name in ("primary", "fallback")],
        "models": [{"name": name, "base_url": "{sim}", "pool": name, "timeout_ms": 30_000}
                   for name in ("primary", "fallback")],
        "workflows": [
            {"name": "dialog", "priority": "interactive", "reserve_ms": RESERVE_MS,
             "candidates": ["primary", "fallback"]},
            {"name": "memory", "priority": "background", "candidates": ["primary", "fallback"]},
        ],
    }


def _isolated(hostname: str) -> list[str]:
    """A command prefix giving the process a hostname of its own, if possible."""
    if shutil.which("unshare") and subprocess.run(
            ["unshare", "-u", "true"], capture_output=True).returncode == 0:
        return ["unshare", "-u", "sh", "-c", 'hostname "$0" && exec "$@"', hostname]
    return []


class LanesArm:
    def __init__(self, workers: int, redis_url: str, state_dir: Path, sim: RemoteSim) -> None:
        self.name = f"lanes_{workers}w"
        self.isolated = bool(_isolated("probe"))
        self._dep = deploy(state_dir, redis_url, catalog(), sim, [])
        self._procs: list[subprocess.Popen] = []
        try:
            for k in range(workers):
                self._procs.append(subprocess.Popen(
                    [*_isolated(f"lanes-bench-{k}"), sys.executable, "-m", "lanes.cli", "worker", "--fleet", FLEET],
                    env=self._dep.env))
            self._wait_for_nodes(2 * workers if self.isolated else 2)  # a foreground and a background node each
        except BaseException:
            self.close()
            raise

    def _wait_for_nodes(self, wanted: int, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        seen: set[str] = set()
        while time.monotonic() < deadline:
            for proc in self._procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a Lanes worker exited with code {proc.returncode} while starting")
            replies = self._dep.client.celery.control.ping(timeout=1.0) or []
            seen = {name for reply in replies for name in reply}
            if len(seen) >= wanted:
                return
            time.sleep(0.2)
        raise RuntimeError(f"Lanes workers did not answer within {timeout:.0f}s: {sorted(seen)} of {wanted} nodes")

    def run(self, requests: list[Request], start_at: float) -> tuple[list[Outcome], float]:
        client = self._dep.client
        pids = [proc.pid for proc in self._procs]
        cpu = process_tree_cpu(pids)
        outcomes = run_on_schedule(
            lambda request, deadline_at: client.submit(
                WORKFLOW[request.kind], CHAT, deadline=datetime.fromtimestamp(deadline_at, timezone.utc)),
            requests, start_at)
        return outcomes, process_tree_cpu(pids) - cpu

    def close(self) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._dep.close()

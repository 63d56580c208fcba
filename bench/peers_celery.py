"""What the Celery-carried arms share (Lanes and plain Celery): sending a
scenario's requests at their moments, seeing each answer as a caller would,
and the CPU seconds of the worker processes; and the plain Celery arm itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from celery.states import READY_STATES, SUCCESS
from peers_workload import CHAT, WIDTH, Outcome, Request
from routing_setup import PLAIN_TASK, ROOT

from lanes.celery_client import make_celery
from lanes.errors import InvalidInput
from lanes.settings import Settings

TICKS = os.sysconf("SC_CLK_TCK")


def process_tree_cpu(roots: list[int]) -> float:
    """User + system CPU seconds of ``roots`` and every live descendant
    (children that already exited are counted in their parent's totals)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        # After the command: state ppid ... utime(14) stime(15) cutime(16) cstime(17), 1-based in stat.
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = sum(int(v) for v in fields[11:15]) / TICKS
    wanted, frontier = set(roots), list(roots)
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in wanted:
                wanted.add(child)
                frontier.append(child)
    return sum(times.get(pid, 0.0) for pid in wanted)


def run_on_schedule(submit, requests: list[Request], start_at: float, poll: float = 0.01) -> list[Outcome]:
    """Send each request at its moment with ``submit(request, deadline_at)``
    (an AsyncResult; ``deadline_at`` in epoch seconds) and record when its
    result is ready, read for all pending at once every ``poll`` s (the moment
    a caller polling its result would see it).

    Times count from the request's moment, not from when its sending thread
    got to it: a burst is sent one request after another, and the time that
    takes on a busy machine is the arm's cost, not the caller's."""
    pending: list[tuple[Request, float, object]] = []
    lock = threading.Lock()
    sending_done = threading.Event()
    outcomes: list[Outcome] = []

    def watch() -> None:
        limit = start_at + max(r.at + r.deadline for r in requests) + 120
        while time.time() < limit:
            with lock:
                batch = list(pending)
            if not batch and sending_done.is_set():
                return
            if batch:
                backend = batch[0][2].backend
                values = backend.mget([backend.get_key_for_task(result.id) for _, _, result in batch])
                now = time.time()
                finished = set()
                for (request, sent, result), value in zip(batch, values):
                    meta = backend.decode_result(value) if value is not None else None
                    if meta is None or meta["status"] not in READY_STATES:
                        continue
                    finished.add(result.id)
                    ok = meta["status"] == SUCCESS
                    reason = "" if ok else _reason(meta.get("result"))
                    outcomes.append(Outcome(request.index, request.kind, sent, now, ok, reason))
                with lock:
                    pending[:] = [p for p in pending if p[2].id not in finished]
            time.sleep(poll)
        with lock:
            for request, sent, _ in pending:
                outcomes.append(Outcome(request.index, request.kind, sent, time.time(), False, "unfinished"))

    def send(kind: str) -> None:
        for request in sorted((r for r in requests if r.kind == kind), key=lambda r: r.at):
            sent = start_at + request.at
            time.sleep(max(0.0, sent - time.time()))
            try:
                result = submit(request, sent + request.deadline)
            except InvalidInput:  # its deadline passed before it could be sent
                with lock:
                    outcomes.append(Outcome(request.index, request.kind, sent, time.time(), False,
                                            "expired before sent"))
                continue
            with lock:
                pending.append((request, sent, result))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # A sender per class: the background job and the interactive users are different callers.
    senders = [threading.Thread(target=send, args=(kind,)) for kind in sorted({r.kind for r in requests})]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    sending_done.set()
    watcher.join()
    return outcomes


def _reason(result) -> str:
    if isinstance(result, dict):
        return str(result.get("exc_type") or "failed")
    return type(result).__name__ if isinstance(result, BaseException) else "failed"


class PlainCeleryArm:
    """Plain Celery tasks (one FIFO queue, a thread per slot of the primary)
    calling the primary directly: no lane, no priority, no fallback. The
    worker is routing_setup's baseline (bench/plain_worker.py), its log
    (a traceback per failed task in the outage) kept in a file."""

    name = "plain_celery"
    QUEUE = "peers-plain"

    def __init__(self, redis_url: str, work: Path, sim) -> None:
        self._sim = sim
        state = work / "plain"
        state.mkdir(parents=True, exist_ok=True)
        settings = Settings(state_dir=state, redis_url=redis_url)
        self._app = make_celery(settings, redis_url, main="peers-plain", kombu_transport=True)
        env = {**os.environ, "LANES_REDIS_URL": redis_url, "LANES_STATE_DIR": str(state)}
        self._log = open(state / "worker.log", "ab")
        self._proc = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "plain_worker.py"), "--concurrency", str(WIDTH),
             "--queue", self.QUEUE], env=env, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"the plain Celery worker exited with code {self._proc.returncode}; "
                                   f"see {state / 'worker.log'}")
            if self._app.control.ping(timeout=0.5):
                return
        self.close()
        raise RuntimeError("the plain Celery worker did not answer within 120 s")

    def run(self, requests: list[Request], start_at: float) -> tuple[list[Outcome], float]:
        app, base_url = self._app, self._sim.base_url
        cpu = process_tree_cpu([self._proc.pid])
        outcomes = run_on_schedule(
            lambda request, deadline_at: app.send_task(PLAIN_TASK, args=[base_url, "primary", CHAT], queue=self.QUEUE),
            requests, start_at)
        return outcomes, process_tree_cpu([self._proc.pid]) - cpu

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._app.close()
        self._log.close()

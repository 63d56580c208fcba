"""What an operator does: watch lanes, resize a pool, run the demo."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from lanes import Priority
from lanes.sim import SimModel
from tests.e2e.harness import deploy
from tests.polling import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

DOC = {
    "pools": [{"name": "gpu", "width": 2, "ceiling": 8}],
    "models": [{"name": "m", "base_url": "{sim}", "pool": "gpu"}],
    "workflows": [{"name": "chat", "candidates": ["m"]}],
}


@pytest.fixture
def dep(tmp_path, embedded_redis):
    url = embedded_redis.url.rsplit("/", 1)[0] + "/4"
    redis.Redis.from_url(url).flushdb()
    deployment = deploy(tmp_path, url, json.loads(json.dumps(DOC)), [SimModel(name="m", capacity=8, service_ms=20.0)],
                        ["gpu"])
    yield deployment
    deployment.close()


def lanes_cli(dep, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "lanes.cli", *args], env=dep.env, capture_output=True,
                          text=True, timeout=timeout)


def worker_concurrency(dep) -> int | None:
    """Threads of the fleet's live worker processes (its foreground and background ones)."""
    stats = dep.client.celery.control.inspect(timeout=1.0).stats() or {}
    threads = [info["pool"]["max-concurrency"] for name, info in stats.items() if name.startswith("gpu@")]
    return sum(threads) if threads else None


def worker_threads_by_name(dep) -> dict[str, int]:
    stats = dep.client.celery.control.inspect(timeout=1.0).stats() or {}
    return {name: info["pool"]["max-concurrency"] for name, info in stats.items() if name.startswith("gpu@")}


def test_a_fleet_worker_freezes_its_start_up_heap(dep):
    # Its full collections then leave the start-up heap alone (workers/app.py).
    def heap():
        stats = dep.client.celery.control.inspect(timeout=1.0).stats() or {}
        return next((info["heap"] for name, info in stats.items() if name.startswith("gpu@")), None)

    frozen = eventually(lambda: (heap() or {}).get("frozen_objects"), timeout=60, interval=0.5,
                        what="the worker's frozen heap")
    assert frozen > 10_000, frozen  # Celery, kombu, httpx and the catalog: far more than this


def test_pools_shows_the_live_lane_of_every_pool(dep):
    lane = dep.lane("gpu")
    with lane.acquire(Priority.INTERACTIVE, timeout=5):
        shown = lanes_cli(dep, "pools", "--json")
    assert shown.returncode == 0, shown.stderr
    (row,) = json.loads(shown.stdout)
    assert row["pool"] == "gpu" and row["width"] == 2 and row["in_flight"] == 1
    assert row["queued"] == {"interactive": 0, "user_tool": 0, "background": 0}
    table = lanes_cli(dep, "pools")
    assert table.returncode == 0 and "gpu" in table.stdout


def test_set_width_resizes_the_lane_and_the_fleet_follows(dep):
    # Pool threads: 2 x width for the foreground queue, as many for background.
    eventually(lambda: len(worker_threads_by_name(dep)) == 2, timeout=60, what="both worker processes")
    assert sorted(worker_threads_by_name(dep).items()) == [
        (f"gpu@{socket.gethostname()}", 4), (f"gpu@{socket.gethostname()}.background", 4)]
    assert worker_concurrency(dep) == 8
    done = lanes_cli(dep, "pools", "set-width", "gpu", "3")
    assert done.returncode == 0, done.stderr
    assert dep.lane("gpu").stats().width == 3
    assert dep.table().pools["gpu"].width == 3
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and worker_concurrency(dep) != 12:
        time.sleep(0.5)
    assert worker_concurrency(dep) == 12
    result = dep.client.submit("chat", {"messages": [{"role": "user", "content": "x"}]}, deadline=30)
    assert result.get(timeout=30)["model"] == "m"


@pytest.mark.parametrize(("args", "message"), [
    (["pools", "set-width", "gpu", "0"], "width 0 is not a width >= 1"),
    (["pools", "set-width", "gpu", "9"], "outside pool 'gpu'"),
    (["pools", "set-width", "nope", "2"], "unknown pool 'nope' (known: gpu)"),
    (["worker", "--fleet", "nope"], "unknown fleet 'nope' (known: gpu)"),
])
def test_operator_mistakes_get_one_clear_line_and_change_nothing(dep, args, message):
    before = dep.lane("gpu").stats().width
    done = lanes_cli(dep, *args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and message in done.stderr and "Traceback" not in done.stderr
    assert dep.lane("gpu").stats().width == before == dep.table().pools["gpu"].width


def test_worker_lists_the_fleets(dep):
    def listing():
        done = lanes_cli(dep, "worker", "--list", "--json")
        assert done.returncode == 0
        (listed,) = json.loads(done.stdout)
        return listed if len(listed["workers"] or []) >= 2 else None

    listed = eventually(listing, timeout=30, interval=0.5, what="both worker processes listed")
    # The fleet's foreground and background processes.
    assert listed["fleet"] == "gpu" and [w.split("@")[0] for w in listed["workers"]] == ["gpu", "gpu"]


def _hold_port(port: int = 0) -> socket.socket | None:
    """A listening socket on ``port`` (0: any), or None when another program already holds it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port left in TIME_WAIT is still free
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    sock.listen()
    return sock


def _range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("..")
    return int(low), int(high or low)


def _warnings(logs: Path, keep: int = 20) -> dict[str, list[str]]:
    """The last warnings and errors of each log in ``logs``."""
    found = {}
    for log in sorted(logs.glob("*.log")):
        lines = [line for line in log.read_text(errors="replace").splitlines()
                 if any(level in line for level in ("WARNING", "ERROR", "CRITICAL", "Traceback"))]
        if lines:
            found[log.name] = lines[-keep:]
    return found


def test_the_demo_runs_the_product_on_embedded_defaults(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANES_")}
    env["LANES_STATE_DIR"] = str(tmp_path / "state")
    # Both default ports taken: the simulator's (the example fleet's 8700, unless another
    # program holds it already) and the embedded Redis's recorded one.
    sim_holder, redis_holder = _hold_port(8700), _hold_port()
    taken_redis = redis_holder.getsockname()[1]
    (tmp_path / "state" / "redis").mkdir(parents=True)
    (tmp_path / "state" / "redis" / "redis.port").write_text(str(taken_redis))
    try:
        done = subprocess.run([sys.executable, "-m", "lanes.cli", "demo", "--requests", "40"], env=env,
                              capture_output=True, text=True, timeout=200, cwd=tmp_path)
    finally:
        for holder in (sim_holder, redis_holder):
            if holder is not None:
                holder.close()
    assert done.returncode == 0, done.stdout + done.stderr
    out = " ".join(done.stdout.split())  # rich wraps long lines
    assert "0 failed" in out and "no backend ever saw more than its width" in out
    for pool in ("aifarm-gpu0-dialog", "aifarm-gpu2-utility", "aifarm-gpu1-media", "aifarm-embedder"):
        assert pool in out
    assert re.search(r"default port taken: simulator 8700 -> \d+", out)
    assert re.search(rf"default port taken: embedded Redis {taken_redis} -> \d+", out)

    # The dialog pool's controller followed its backend: up from the configured 4 towards the
    # capacity of 6, then down after the capacity fell to 3 midway (a probe one step above it allowed).
    adaptive = re.search(r"adaptive: aifarm-gpu0-dialog started at its configured width 4, held (\S+) while its "
                         r"backend's capacity was 6 and (\S+) after it changed to 3 \((\d+) width changes", out)
    assert adaptive, out
    before, after = _range(adaptive[1]), _range(adaptive[2])
    # On failure the whole output (the demo names the controller's decisions when it fell
    # short) and the warnings the workers logged.
    assert before[0] >= 5 and before[1] <= 8, (before, out, _warnings(tmp_path / "state" / "logs"))
    assert after[0] <= 4 and after[1] <= 5, (after, out, _warnings(tmp_path / "state" / "logs"))
    assert int(adaptive[3]) >= 2, out
    assert re.search(r"aifarm-gpu0-dialog │ 4 → \S+ → \S+ │ 6 → 3 │", out)

    # The HTTP API ran beside the workers and answered with every pool.
    assert re.search(r"admin API: http://127\.0\.0\.1:\d+/v1/pools answered 5 pools \(aifarm-embedder 8,", out), out

    # The beat ran: its start-up scan created the demo chats' memory runs, and all were done.
    assert re.search(r"beat: active \(\S+\); its start-up scan created 3 memory runs, 3 done", out), out

    # The plot: a real PNG with something drawn on it.
    plot = Path(re.search(r"plot: (\S+\.png)", out)[1])
    assert plot == tmp_path / "state" / "demo.png"
    data = plot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    from matplotlib.image import imread

    pixels = imread(plot)
    height, width = pixels.shape[:2]
    assert height > 300 and width > 500
    ink = (pixels[..., :3] < 0.9).any(axis=-1).mean()  # share of pixels that are not near white
    assert ink > 0.02
    colours = {tuple(p) for p in (pixels[::7, ::7, :3] * 255).astype(int).reshape(-1, 3)}
    assert len(colours) > 20  # lines of several colours, text and axes: not a blank or one-colour image

    # The demo stops the embedded Redis it started.
    from lanes.embedded import EmbeddedRedis

    assert not EmbeddedRedis(tmp_path / "state" / "redis").is_running()


def test_an_unreachable_redis_is_one_clear_line_and_exit_3(dep):
    env = {**dep.env, "LANES_REDIS_URL": "redis://127.0.0.1:1/0", "LANES_REDIS_TIMEOUT_SECONDS": "1"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "lanes.cli", "submit", "chat", "--payload",
                           json.dumps({"messages": [{"role": "user", "content": "x"}]})],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr
    assert time.monotonic() - started < 30


def test_sigterm_to_lanes_worker_stops_the_whole_fleet_worker(dep):
    dep.stop_worker("gpu")  # this test runs the fleet's worker the way an operator does
    proc = subprocess.Popen([sys.executable, "-m", "lanes.cli", "worker", "--fleet", "gpu"], env=dep.env)
    dep.workers["gpu"] = proc  # whatever happens below, the fixture stops it
    dep.wait_for_workers(["gpu"])
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert children, "the supervisor runs its worker as a child"
    proc.terminate()
    assert proc.wait(40) == 0
    # The supervisor took the signal itself and stopped its worker: nothing is left running.
    assert not any(_running(int(pid)) for pid in children)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False

"""The product's main job on embedded defaults, end to end.

Starts (or attaches to) the embedded Redis, applies the example fleet to the
catalog with the ``vllm`` controller turned on for the dialog pool, serves it
with the simulator, runs a worker per fleet, the beat, a memory worker and
the HTTP API, sends a mixed workload (interactive, user tool, background),
then keeps the dialog pool busy while its simulated backend's capacity changes midway, and
prints, per pool, how many requests it served, how long they waited in its
lane, how often it was passed over, its configured width and the width over
time against the backend's capacity, the highest concurrency the simulated
backend saw against the width, the memory runs the beat created, and the
path of a PNG plot of it all.

A default port another program holds (the simulator's, the embedded
Redis's, the API's) is replaced by a free one, and the summary says so.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from lanes.catalog import apply_document, load_routing, open_catalog, read_document
from lanes.celery_client import HOSTED_FLEET
from lanes.demo import memory as memory_demo
from lanes.demo import services
from lanes.demo.control import ADAPTIVE_POOL, CAPACITIES, AdaptiveStep, move_port, run_adaptive_step, with_controller
from lanes.demo.plot import Timeline
from lanes.demo.report import DemoReport, print_report, summarise
from lanes.demo.report import plot as plot_demo
from lanes.embedded import EmbeddedRedis, free_port, port_free
from lanes.errors import InvalidInput
from lanes.priority import Priority
from lanes.redis_conn import connect, resolve_redis_url
from lanes.routing.client import LanesClient
from lanes.settings import Settings

EXAMPLE_CATALOG = Path(__file__).resolve().parents[2] / "examples" / "aifarm.toml"

CHAT = {"messages": [{"role": "user", "content": "Summarise the last hour of this chat."}], "max_tokens": 16}
EMBED = {"input": ["a memory worth keeping", "another one"]}

# (workflow, priority override, deadline seconds or None, share of the workload)
WORKLOAD = [
    ("memory_extraction", None, None, 0.22),
    ("subject_merge", None, None, 0.06),
    # 1 s for GPU0 beyond dialog's 30 s fallback reserve: the tail of a burst spills over.
    ("dialog", None, 31.0, 0.24),
    ("history_summary", None, 60.0, 0.08),
    ("youtube", None, 60.0, 0.04),
    ("speech_recognition", None, 60.0, 0.05),
    ("image", None, 90.0, 0.04),
    ("music", None, 90.0, 0.03),
    ("embeddings", "background", None, 0.10),
    ("embeddings", None, 30.0, 0.06),
    ("redaction", None, 30.0, 0.08),
]


@dataclass
class Submitted:
    workflow: str
    priority: Priority
    result: object
    started: float
    done: bool = False
    ok: bool = False
    seconds: float = 0.0


def run_demo(settings: Settings, *, requests: int = 160, catalog: Path | None = None, seed: int = 7,
             console: Console | None = None, plot: Path | None = None,
             phase_seconds: float = 6.0) -> DemoReport:
    console = console or Console(width=100)
    catalog = catalog or _example_catalog()
    document = read_document(catalog)  # a bad file fails here, before anything starts
    plot = _writable_plot_path(plot or settings.state_dir / "demo.png")  # and so does a plot path it cannot write
    report = DemoReport()
    adaptive = with_controller(document)
    sim_port = _simulator_port(document, report)
    with ExitStack() as cleanup:  # whatever fails, everything started is stopped
        started_redis = not settings.redis_url and not _embedded_running(settings)
        if started_redis:
            _move_taken_redis_port(settings, report)
        redis_url = resolve_redis_url(settings)
        if started_redis:
            cleanup.callback(EmbeddedRedis(settings.state_dir / "redis").stop)
        console.print(f"[bold]Lanes demo[/] · Redis {redis_url} · catalog {settings.catalog_url()}")
        for moved in report.moved_ports:
            console.print(f"[yellow]default port taken[/]: {moved}")

        engine = open_catalog(settings)
        cleanup.callback(engine.dispose)
        changes = apply_document(engine, document)
        table = load_routing(engine)
        console.print(f"applied {catalog.name}: {len(table.pools)} pools, {len(table.models)} models, "
                      f"{len(table.workflows)} workflows ({len(changes.changes)} changes)"
                      + (f"; vllm controller on {ADAPTIVE_POOL}" if adaptive else ""))
        if started_redis:
            _start_over(settings, redis_url, table)
        _provision(settings, redis_url, table, started_redis or not changes.empty)
        # Before the beat starts: its start-up scan creates these chats' memory runs.
        chats = memory_demo.ingest_demo_chats(settings)

        sim = _simulator(catalog, sim_port, adaptive=adaptive)
        cleanup.callback(sim.stop)
        console.print(f"simulator serving {len(sim.stats())} models at {sim.url}")

        fleets = sorted({r.fleet or HOSTED_FLEET for r in table.workflows.values() if r.candidates})
        workers = _start_workers(settings, fleets)
        cleanup.callback(_stop_workers, workers)
        memory_worker = services.start_memory_worker(settings, redis_url)
        cleanup.callback(services.stop, memory_worker)
        beat = services.start_beat(settings, redis_url)
        cleanup.callback(services.stop, beat)
        # The admin and submit HTTP API, beside the workers and the beat.
        port, taken = services.api_port()
        if taken is not None:
            report.moved_ports.append(f"admin API {taken} -> {port}")
        api = services.start_api(settings, redis_url, port)
        cleanup.callback(services.stop, api)
        client = LanesClient(settings, redis_url=redis_url)
        cleanup.callback(client.close)

        _wait_for_workers(client, fleets, console)
        api_url = f"http://127.0.0.1:{port}"
        if services.wait_for_api(api_url, api):
            report.api_url = api_url
            console.print(f"admin API at {api_url} (OpenAPI at {api_url}/docs)")
        adaptive_model = _adaptive_model(table) if adaptive else None
        timeline = Timeline(settings, redis_url, table, capacity=(
            (lambda: sim.stats()[adaptive_model]["capacity"]) if adaptive_model else None)).start()
        cleanup.callback(timeline.stop)
        since = time.time()
        submitted = run_workload(client, requests, seed, console)
        if adaptive_model:
            pool = table.pools[ADAPTIVE_POOL]
            report.adaptive = run_adaptive_step(
                client, sim.url, AdaptiveStep(ADAPTIVE_POOL, adaptive_model, pool.width, CAPACITIES),
                timeline, console, phase_seconds=phase_seconds)
        report.memory_runs = memory_demo.show_memory_runs(settings, chats, console)
        report.beat = services.beat_status(settings, redis_url)
        if report.api_url:
            report.api_pools = services.api_pools(report.api_url)
        timeline.stop()
        summarise(report, settings, redis_url, table, sim.stats(), submitted, since)
        report.plot = plot_demo(report, timeline, plot)
        print_report(report, console)
        return report


def _writable_plot_path(path: Path) -> Path:
    if path.is_dir():
        raise InvalidInput(f"--plot {path}: is a folder; name a file such as {path / 'demo.png'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput(f"--plot {path}: cannot create its folder {path.parent}: {exc.strerror or exc}; "
                           "name a file in a folder you can write") from None
    return path


def _simulator_port(document: dict, report: DemoReport) -> int:
    """The port the catalog's simulated models name, or a free one (rewriting the document) when it is taken."""
    from urllib.parse import urlsplit

    ports = sorted({urlsplit(m["base_url"]).port for m in document.get("models", [])
                    if m.get("base_url", "").startswith("http://127.0.0.1:")})
    wanted = ports[0] if ports else 8700
    if port_free(wanted):
        return wanted
    moved = move_port(document, wanted)
    report.moved_ports.append(f"simulator {wanted} -> {moved}")
    return moved


def _move_taken_redis_port(settings: Settings, report: DemoReport) -> None:
    """The embedded Redis keeps one port per state folder; the demo picks a new one when another program holds it."""
    server = EmbeddedRedis(settings.state_dir / "redis")
    recorded = server.port
    if recorded is not None and not port_free(recorded):
        new = free_port()
        EmbeddedRedis(settings.state_dir / "redis", port=new).ensure()
        report.moved_ports.append(f"embedded Redis {recorded} -> {new}")


def _adaptive_model(table) -> str | None:
    return next((m.name for m in sorted(table.models.values(), key=lambda m: m.name)
                 if m.pool and m.pool.name == ADAPTIVE_POOL), None)


def _simulator(catalog: Path, port: int, *, adaptive: bool):
    from lanes.sim import SimModel, Simulator, catalog_models

    # Short service times so the whole demo takes well under a minute; gauges
    # visible 1 s after each engine step, so the controller has something to follow.
    template = SimModel(name="_", ttft_ms=40.0, per_token_ms=8.0, tokens=12, embedding_ms=30.0, metrics_lag_s=1.0)
    served = catalog_models(catalog, template).models
    catalog_ports = {m.port for m in served if m.port is not None}
    # Every model of the catalog's port is served on the demo's port (the same one unless it was taken).
    served = [replace(m, port=None) if m.port in catalog_ports else m for m in served]
    if adaptive:  # the controlled pool's backend starts at a capacity the controller is not told
        served = [replace(m, capacity=CAPACITIES[0]) if m.device == ADAPTIVE_POOL else m for m in served]
    return Simulator(served, host="127.0.0.1", port=port).start()


def _example_catalog() -> Path:
    for candidate in (EXAMPLE_CATALOG, Path.cwd() / "examples" / "aifarm.toml"):
        if candidate.exists():
            return candidate
    raise InvalidInput("no examples/aifarm.toml here or beside the package; pass --catalog FILE")


def _provision(settings: Settings, redis_url: str, table, nobody_holds: bool) -> None:
    """Skip the lanes' quiet period when nobody can hold a slot yet: this demo
    started Redis itself, or has just created the pools."""
    if not nobody_holds:
        return
    from lanes.routing.runtime import provision_lanes

    client = connect(redis_url)
    try:
        provision_lanes(client, settings, table)
    finally:
        client.close()


def _start_over(settings: Settings, redis_url: str, table) -> None:
    """Each run of the demo starts where the first did, when it started Redis itself.

    The embedded Redis keeps an append-only file. A second run read back the first
    one's lanes under a new server run, which every lane answers with a quiet period
    of one lease (every request of the workload waited about 20 s), and the dialog
    pool's learned width (a cap of 3 from the last run's capacity change, where this
    run's backend starts at 6). No process can hold a slot or wait in a lane of a
    Redis this run just started: the lanes' state and the learned widths go, and
    ``_provision`` creates the lanes afresh.
    """
    from lanes.control.store import ControlStore
    from lanes.namespace import Namespace
    from lanes.pools import pool_lane

    client = connect(redis_url)
    try:
        store = ControlStore(client, Namespace(settings.key_prefix))
        for pool in table.pools.values():
            store.forget(pool.id)
            client.delete(*pool_lane(client, settings, pool).keys.all())
    finally:
        client.close()


def _embedded_running(settings: Settings) -> bool:
    return EmbeddedRedis(settings.state_dir / "redis").is_running()


def _start_workers(settings: Settings, fleets: list[str]) -> list[subprocess.Popen]:
    env = os.environ.copy()
    env["LANES_STATE_DIR"] = str(settings.state_dir)
    if settings.redis_url:
        env["LANES_REDIS_URL"] = settings.redis_url
    # The dialog pool's controller may take it above its configured width: with no memory
    # gate the workers would fail closed and hold it at the configured width (docs/ADAPTIVE_WIDTHS.md,
    # "Memory gate"). Where the cgroup has no limit the gate reads nothing and never blocks.
    env.setdefault("LANES_MEMORY_GATE_HIGH", "0.9")
    logs = settings.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for fleet in fleets:
        with open(logs / f"worker-{fleet}.log", "ab") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "workers.supervisor", "--fleet", fleet, "--poll-seconds", "2"],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            ))
    return procs


def _stop_workers(workers: list[subprocess.Popen]) -> None:
    for proc in workers:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in workers:
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_for_workers(client: LanesClient, fleets: list[str], console: Console, timeout: float = 90.0) -> None:
    wanted = set(fleets)
    deadline = time.monotonic() + timeout
    console.print(f"starting {len(fleets)} fleet workers: {', '.join(fleets)} (logs in {client.settings.state_dir / 'logs'})")
    with console.status("waiting for the workers"):
        while time.monotonic() < deadline:
            replies = client.celery.control.ping(timeout=0.5) or []
            seen = {name.split("@", 1)[0] for reply in replies for name in reply}
            if wanted <= seen:
                console.print(f"{len(wanted)} fleet workers ready")
                return
            time.sleep(0.3)
    raise RuntimeError(f"fleet workers did not start within {timeout:.0f}s: missing {sorted(wanted - seen)}")


def plan_workload(table, total: int, seed: int) -> list[tuple[str, Priority, str | None, float | None]]:
    """(workflow, priority, priority override, deadline) of every request, in sending order."""
    rng = random.Random(seed)
    plan: list[tuple[str, str | None, float | None]] = []
    for workflow, priority, deadline, share in WORKLOAD:
        if workflow in table.workflows:
            plan += [(workflow, priority, deadline)] * max(1, round(total * share))
    # Background first, as an hourly memory run would arrive, then the rest mixed in.
    background = [p for p in plan if _priority(table, p) is Priority.BACKGROUND]
    others = [p for p in plan if _priority(table, p) is not Priority.BACKGROUND]
    rng.shuffle(others)
    return [(w, _priority(table, (w, p, d)), p, d) for w, p, d in background + others]


def _priority(table, item) -> Priority:
    workflow, priority, _ = item
    return Priority.parse(priority) if priority else table.workflows[workflow].priority


def run_workload(client: LanesClient, total: int, seed: int, console: Console,
                 timeout: float = 300.0) -> list[Submitted]:
    """Send the workload and follow it on one display, from the first submission.

    Each priority's bar counts answers against the requests planned for it;
    the sent count beside it moves as requests go out. (Following only after
    everything was sent showed background bars that jumped to nearly full:
    their answers had come in while the rest was still being sent.)
    """
    table = client.table()
    plan = plan_workload(table, total, seed)
    planned = {p: sum(1 for item in plan if item[1] is p) for p in Priority}
    columns = [TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("answered · {task.fields[sent]} sent"), TimeElapsedColumn()]
    submitted: list[Submitted] = []
    with Progress(*columns, console=console) as progress:
        bars = {p: progress.add_task(p.label, total=planned[p], sent=0) for p in Priority}
        sent = dict.fromkeys(Priority, 0)
        polled = time.monotonic()
        for workflow, priority, override, deadline in plan:
            payload = EMBED if table.workflows[workflow].candidates[0].kind == "embedding" else CHAT
            result = client.submit(workflow, payload, priority=override, deadline=deadline)
            submitted.append(Submitted(workflow, priority, result, time.monotonic()))
            sent[priority] += 1
            progress.update(bars[priority], sent=sent[priority])
            if time.monotonic() - polled >= 0.1:  # one read per unanswered task, so not after every send
                _collect_answers(submitted, progress, bars)
                polled = time.monotonic()
        deadline_at = time.monotonic() + timeout
        while time.monotonic() < deadline_at and not all(s.done for s in submitted):
            _collect_answers(submitted, progress, bars)
            time.sleep(0.1)
    return submitted


def _collect_answers(submitted: list[Submitted], progress: Progress, bars: dict) -> None:
    for s in submitted:
        if not s.done and s.result.ready():
            s.done, s.ok = True, s.result.successful()
            s.seconds = time.monotonic() - s.started
            progress.advance(bars[s.priority])

"""The product's main job on embedded defaults, end to end.

Starts (or attaches to) the embedded Redis, applies the example fleet to the
catalog, serves it with the simulator, runs a worker per fleet, sends a mixed
workload (interactive, user tool, background) and prints, per pool, how many
requests it served, how long they waited in its lane, how often it was passed
over, and the highest concurrency the simulated backend saw against the width.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lanes.catalog import apply_document, load_routing, open_catalog, read_document
from lanes.celery_client import HOSTED_FLEET
from lanes.embedded import EmbeddedRedis
from lanes.errors import InvalidInput
from lanes.priority import Priority
from lanes.redis_conn import connect, resolve_redis_url
from lanes.routing.client import LanesClient
from lanes.routing.events import EventLog
from lanes.settings import Settings

EXAMPLE_CATALOG = Path(__file__).resolve().parent.parent / "examples" / "aifarm.toml"

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


@dataclass
class DemoReport:
    pools: list[dict] = field(default_factory=list)
    priorities: dict[str, dict] = field(default_factory=dict)
    failures: int = 0
    over_admitted: bool = False


def run_demo(settings: Settings, *, requests: int = 160, catalog: Path | None = None, seed: int = 7,
             console: Console | None = None) -> DemoReport:
    console = console or Console(width=100)
    catalog = catalog or _example_catalog()
    document = read_document(catalog)  # a bad file fails here, before anything starts
    with ExitStack() as cleanup:  # whatever fails, everything started is stopped
        started_redis = not settings.redis_url and not _embedded_running(settings)
        redis_url = resolve_redis_url(settings)
        if started_redis:
            cleanup.callback(EmbeddedRedis(settings.state_dir / "redis").stop)
        console.print(f"[bold]Lanes demo[/] · Redis {redis_url} · catalog {settings.catalog_url()}")

        engine = open_catalog(settings)
        cleanup.callback(engine.dispose)
        changes = apply_document(engine, document)
        table = load_routing(engine)
        console.print(f"applied {catalog.name}: {len(table.pools)} pools, {len(table.models)} models, "
                      f"{len(table.workflows)} workflows ({len(changes.changes)} changes)")
        _provision(settings, redis_url, table, started_redis or not changes.empty)

        sim = _simulator(catalog)
        cleanup.callback(sim.stop)
        console.print(f"simulator serving {len(sim.stats())} models at {sim.url}")

        fleets = sorted({r.fleet or HOSTED_FLEET for r in table.workflows.values() if r.candidates})
        workers = _start_workers(settings, fleets)
        cleanup.callback(_stop_workers, workers)
        client = LanesClient(settings, redis_url=redis_url)
        cleanup.callback(client.close)

        _wait_for_workers(client, fleets, console)
        since = time.time()
        submitted = run_workload(client, requests, seed, console)
        report = _summarise(settings, redis_url, table, sim.stats(), submitted, since)
        _print_report(report, console)

        from lanes.memory.demo import show_memory_runs

        if not show_memory_runs(settings, redis_url, client, console):
            report.failures += 1
        return report


def _simulator(catalog: Path):
    from lanes.sim import SimModel, Simulator, catalog_models

    # Short service times so the whole demo takes well under a minute.
    template = SimModel(name="_", ttft_ms=40.0, per_token_ms=8.0, tokens=12, embedding_ms=30.0)
    served = catalog_models(catalog, template).models
    ports = sorted({m.port for m in served if m.port is not None})
    return Simulator(served, host="127.0.0.1", port=ports[0] if ports else 8700).start()


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


def _embedded_running(settings: Settings) -> bool:
    return EmbeddedRedis(settings.state_dir / "redis").is_running()


def _start_workers(settings: Settings, fleets: list[str]) -> list[subprocess.Popen]:
    env = os.environ.copy()
    env["LANES_STATE_DIR"] = str(settings.state_dir)
    if settings.redis_url:
        env["LANES_REDIS_URL"] = settings.redis_url
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


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _summarise(settings, redis_url, table, sim_stats, submitted, since) -> DemoReport:
    client = connect(redis_url)
    try:
        log = EventLog(client, prefix=settings.key_prefix)
        waits = log.list(kind="lane_wait", since=since, limit=100_000)
        bypasses = log.list(kind="lane_bypass", since=since, limit=100_000)
    finally:
        client.close()
    report = DemoReport()
    for pool in sorted(table.pools.values(), key=lambda p: p.name):
        pool_waits = [e.detail.get("wait_ms", 0.0) for e in waits if e.pool == pool.name]
        models = [m.name for m in table.models.values() if m.pool and m.pool.name == pool.name]
        seen = max((sim_stats[m]["device_max_in_flight"] for m in models if m in sim_stats), default=0)
        report.pools.append({
            "pool": pool.name,
            "width": pool.width,
            "requests": len(pool_waits),
            "wait_p50_ms": _percentile(pool_waits, 50),
            "wait_p95_ms": _percentile(pool_waits, 95),
            "bypasses": sum(1 for e in bypasses if e.pool == pool.name),
            "max_concurrency": seen,
        })
        report.over_admitted |= seen > pool.width
    for p in Priority:
        mine = [s for s in submitted if s.priority is p]
        times = [s.seconds for s in mine if s.ok]
        report.priorities[p.label] = {
            "requests": len(mine),
            "ok": len(times),
            "p50_s": _percentile(times, 50),
            "p95_s": _percentile(times, 95),
        }
    report.failures = sum(1 for s in submitted if not s.ok)
    return report


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.0f}" if isinstance(value, float) else str(value)


def _print_report(report: DemoReport, console: Console) -> None:
    pools = Table(title="per pool (waits in ms; peak = highest concurrency the backend saw)")
    pools.add_column("pool", no_wrap=True)
    for column in ("width", "reqs", "wait p50", "wait p95", "bypass", "peak"):
        pools.add_column(column, justify="right", no_wrap=True)
    for row in report.pools:
        flag = "" if row["max_concurrency"] <= row["width"] else " [red]OVER WIDTH[/]"
        pools.add_row(row["pool"], str(row["width"]), str(row["requests"]), _fmt(row["wait_p50_ms"]),
                      _fmt(row["wait_p95_ms"]), str(row["bypasses"]), f"{row['max_concurrency']}{flag}")
    console.print(pools)
    prios = Table(title="per priority (submit to answer)")
    for column in ("priority", "requests", "ok", "p50 s", "p95 s"):
        prios.add_column(column)
    for label, row in report.priorities.items():
        prios.add_row(label, str(row["requests"]), str(row["ok"]),
                      "-" if row["p50_s"] is None else f"{row['p50_s']:.2f}",
                      "-" if row["p95_s"] is None else f"{row['p95_s']:.2f}")
    console.print(prios)
    verdict = "no backend ever saw more than its width" if not report.over_admitted else "a backend saw more than its width"
    console.print(f"{report.failures} failed · {verdict}")

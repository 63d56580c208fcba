"""The demo's summary: what each pool served and waited, its width over time, and the plot.

Built from the routing events of the run (lane waits, bypasses, width
changes), the simulator's own counts and the demo's timeline; printed as
tables beside the path of the PNG plot.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from lanes.demo.control import AdaptiveStep
from lanes.demo.plot import Timeline, plot_timeline
from lanes.priority import Priority
from lanes.redis_conn import connect
from lanes.routing.events import EventLog


@dataclass
class DemoReport:
    pools: list[dict] = field(default_factory=list)
    priorities: dict[str, dict] = field(default_factory=dict)
    failures: int = 0
    over_admitted: bool = False
    adaptive: AdaptiveStep | None = None
    beat: dict | None = None
    memory_runs: dict = field(default_factory=dict)
    moved_ports: list[str] = field(default_factory=list)  # "simulator 8700 -> 41234" when a default was taken
    plot: Path | None = None
    plot_error: str | None = None
    api_url: str | None = None  # the demo's `lanes api`, when it answered
    api_pools: list[dict] | None = None  # what its GET /v1/pools said at the end
    waits: list = field(default_factory=list)  # the run's lane_wait events


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def summarise(report: DemoReport, settings, redis_url, table, sim_stats, submitted, since) -> None:
    client = connect(redis_url)
    try:
        log = EventLog(client, prefix=settings.key_prefix)
        waits = log.list(kind="lane_wait", since=since, limit=100_000)
        bypasses = log.list(kind="lane_bypass", since=since, limit=100_000)
        changes = log.list(kind="width_change", since=since, limit=100_000)
    finally:
        client.close()
    report.waits = waits
    adaptive = report.adaptive
    for pool in sorted(table.pools.values(), key=lambda p: p.name):
        pool_waits = [e.detail.get("wait_ms", 0.0) for e in waits if e.pool == pool.name]
        models = [m.name for m in table.models.values() if m.pool and m.pool.name == pool.name]
        seen = max((sim_stats[m]["device_max_in_flight"] for m in models if m in sim_stats), default=0)
        # The widest the lane ever was: its configured width, or a controller's higher one.
        widest = max([pool.width] + [e.detail["new"] for e in changes if e.pool == pool.name])
        if adaptive is not None and adaptive.pool == pool.name:
            over_time, capacity = adaptive.widths, list(adaptive.capacities)
        else:
            over_time, capacity = [pool.width], sorted({sim_stats[m]["capacity"] for m in models if m in sim_stats})
        report.pools.append({
            "pool": pool.name,
            "configured": pool.width,
            "widths": over_time,
            "capacity": capacity,
            "width_changes": sum(1 for e in changes if e.pool == pool.name),
            "requests": len(pool_waits),
            "wait_p50_ms": _percentile(pool_waits, 50),
            "wait_p95_ms": _percentile(pool_waits, 95),
            "bypasses": sum(1 for e in bypasses if e.pool == pool.name),
            "max_concurrency": seen,
            "widest": widest,
        })
        report.over_admitted |= seen > widest
    for p in Priority:
        mine = [s for s in submitted if s.priority is p]
        times = [s.seconds for s in mine if s.ok]
        report.priorities[p.label] = {
            "requests": len(mine),
            "ok": len(times),
            "p50_s": _percentile(times, 50),
            "p95_s": _percentile(times, 95),
        }
    report.failures = sum(1 for s in submitted if not s.ok) + (adaptive.failed if adaptive else 0)
    report.failures += report.memory_runs.get("runs", 0) - report.memory_runs.get("done", 0)


def plot(report: DemoReport, timeline: Timeline, path: Path) -> Path | None:
    adaptive = report.adaptive
    try:
        return plot_timeline(timeline, report.waits, path, adaptive_pool=adaptive.pool if adaptive else None,
                             changed_at=adaptive.changed_at if adaptive else None)
    except OSError as exc:  # an unwritable path costs the plot, not the demo's summary
        report.plot_error = f"could not write the plot to {path}: {exc.strerror or exc}"
        return None


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.0f}" if isinstance(value, float) else str(value)


def _arrow(values: list) -> str:
    return " → ".join("-" if v is None else str(v) for v in values) if values else "-"


def print_report(report: DemoReport, console: Console) -> None:
    pools = Table(title="per pool: width configured → held before → after the capacity change; cap = the "
                        "backend's capacity; waits in ms; peak = highest concurrency the backend saw")
    pools.add_column("pool", no_wrap=True)
    for column in ("width", "cap", "reqs", "wait p50", "wait p95", "bypass", "peak"):
        pools.add_column(column, justify="right", no_wrap=True)
    for row in report.pools:
        flag = "" if row["max_concurrency"] <= row["widest"] else " [red]OVER WIDTH[/]"
        pools.add_row(row["pool"], _arrow(row["widths"]), _arrow(row["capacity"]),
                      str(row["requests"]), _fmt(row["wait_p50_ms"]), _fmt(row["wait_p95_ms"]), str(row["bypasses"]),
                      f"{row['max_concurrency']}{flag}")
    console.print(pools)
    prios = Table(title="per priority (submit to answer, mixed workload)")
    for column in ("priority", "requests", "ok", "p50 s", "p95 s"):
        prios.add_column(column)
    for label, row in report.priorities.items():
        prios.add_row(label, str(row["requests"]), str(row["ok"]),
                      "-" if row["p50_s"] is None else f"{row['p50_s']:.2f}",
                      "-" if row["p95_s"] is None else f"{row['p95_s']:.2f}")
    console.print(prios)
    step = report.adaptive
    if step is not None:
        changes = next((r["width_changes"] for r in report.pools if r["pool"] == step.pool), 0)
        configured, before, after = (step.widths + [None] * 3)[:3]
        console.print(f"adaptive: {step.pool} started at its configured width {configured}, held {_arrow([before])} "
                      f"while its backend's capacity was {step.capacities[0]} and {_arrow([after])} after it changed "
                      f"to {step.capacities[1]} ({changes} width changes, {step.answered} requests answered under "
                      f"the controller)")
    if report.beat:
        console.print(f"beat: active ({report.beat.get('owner', '?')}); its start-up scan created "
                      f"{report.memory_runs.get('runs', 0)} memory runs, {report.memory_runs.get('done', 0)} done")
    else:
        console.print("beat: [red]not active[/] (see its log in the state folder's logs/beat.log)")
    if report.api_url and report.api_pools is not None:
        widths = ", ".join(f"{p['pool']} {p['width']}" for p in report.api_pools)
        console.print(f"admin API: {report.api_url}/v1/pools answered {len(report.api_pools)} pools ({widths})")
    else:
        console.print("admin API: [red]did not answer[/] (see the state folder's logs/api.log)")
    for moved in report.moved_ports:
        console.print(f"default port taken: {moved}")
    if report.plot is not None:
        console.print(f"plot: {report.plot}")
    elif report.plot_error:
        console.print(f"plot: [red]{report.plot_error}[/]")
    verdict = "no backend ever saw more than its width" if not report.over_admitted else "a backend saw more than its width"
    console.print(f"{report.failures} failed · {verdict}")

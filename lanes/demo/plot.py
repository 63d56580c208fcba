"""The demo's timeline: every lane's width and in-flight count sampled while it runs, and its plot.

A :class:`Timeline` thread reads each pool's lane (the same Redis state every
worker sees; reading never creates a lane) four times a second, and the
simulated capacity of the adaptive pool's backend. :func:`plot_timeline`
draws it with matplotlib's Agg backend (no display needed) into one PNG:
a panel per pool (width, in-flight, and the backend's capacity where a
controller follows it), and the lane waits per priority from the routing
events.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from lanes.catalog.controllers import running_kinds
from lanes.control.store import ControlStore
from lanes.namespace import Namespace
from lanes.pools import pool_lane
from lanes.priority import Priority
from lanes.redis_conn import connect

PRIORITY_COLOURS = {Priority.INTERACTIVE.label: "tab:red", Priority.USER_TOOL.label: "tab:orange",
                    Priority.BACKGROUND.label: "tab:blue"}


@dataclass
class Series:
    times: list[float] = field(default_factory=list)
    width: list[int] = field(default_factory=list)
    in_flight: list[int] = field(default_factory=list)
    # The controller's decisions, where one runs: (time.time() when seen, decision, reason).
    decisions: list[tuple[float, str, str]] = field(default_factory=list)


class Timeline:
    def __init__(self, settings, redis_url: str, table, *, period: float = 0.25,
                 capacity=None) -> None:
        """``capacity``: a callable giving the adaptive backend's capacity now, or None."""
        self.client = connect(redis_url)
        self.lanes = {pool.name: pool_lane(self.client, settings, pool) for pool in table.pools.values()}
        self.control = ControlStore(self.client, Namespace(settings.key_prefix))
        self.controlled = {pool.name: pool.id for pool in table.pools.values() if running_kinds(pool)}
        self._decided: dict[str, float | None] = {}
        self.series = {name: Series() for name in self.lanes}
        self.capacity_of = capacity
        self.capacity: list[tuple[float, int]] = []
        self.period = period
        self.started = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-timeline", daemon=True)

    def start(self) -> "Timeline":
        self.started = time.time()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.sample()
            except Exception:  # a missed sample only thins the plot
                pass

    def sample(self) -> None:
        now = time.time()
        for name, lane in self.lanes.items():
            stats = lane.stats()
            if not stats.exists:
                continue
            series = self.series[name]
            series.times.append(now)
            series.width.append(stats.width)
            series.in_flight.append(stats.in_flight)
            if name in self.controlled:
                self._sample_decision(name, series, now)
        if self.capacity_of is not None:
            self.capacity.append((now, self.capacity_of()))

    def _sample_decision(self, name: str, series: Series, now: float) -> None:
        state = self.control.read(self.controlled[name])
        if state is not None and state.decided_at is not None and state.decided_at != self._decided.get(name):
            self._decided[name] = state.decided_at
            series.decisions.append((now, state.decision or "", state.reason or ""))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.client.close()


def plot_timeline(timeline: Timeline, waits, path: Path, *, adaptive_pool: str | None = None,
                  changed_at: float | None = None) -> Path:
    """Write the PNG; ``waits`` are the ``lane_wait`` events of the run."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    names = sorted(timeline.series)
    rows = (len(names) + 2) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(12, 3.2 * rows), squeeze=False)
    flat = list(axes.flat)
    t0 = timeline.started
    for ax, name in zip(flat, names):
        series = timeline.series[name]
        times = [t - t0 for t in series.times]
        ax.step(times, series.width, where="post", label="width", color="black", linewidth=1.8)
        ax.plot(times, series.in_flight, label="in flight", color="tab:green", linewidth=1.0)
        if name == adaptive_pool and timeline.capacity:
            ax.step([t - t0 for t, _ in timeline.capacity], [c for _, c in timeline.capacity], where="post",
                    label="backend capacity", color="tab:purple", linestyle="--")
        if name == adaptive_pool and changed_at is not None:
            ax.axvline(changed_at - t0, color="tab:purple", linestyle=":", linewidth=1)
        ax.set_title(name + (" (vllm controller)" if name == adaptive_pool else ""), fontsize=10)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("seconds")
        ax.legend(fontsize=8, loc="upper right")
    waits_ax = flat[len(names)]
    for label, colour in PRIORITY_COLOURS.items():
        mine = [e for e in waits if e.detail.get("priority") == label]
        waits_ax.scatter([e.time - t0 for e in mine], [e.detail.get("wait_ms", 0.0) for e in mine], s=8,
                         color=colour, label=f"{label} ({len(mine)})", alpha=0.7)
    waits_ax.set_title("lane waits per priority", fontsize=10)
    waits_ax.set_xlabel("seconds")
    waits_ax.set_ylabel("wait ms")
    waits_ax.legend(fontsize=8, loc="upper right")
    for ax in flat[len(names) + 1:]:
        ax.set_visible(False)
    fig.suptitle("Lanes demo: width and in-flight per pool, waits per priority")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path

"""The demo's adaptive step: a controller on the dialog pool follows its backend's capacity.

The demo turns the ``vllm`` controller on for one pool of the example fleet
(ticking and scraping every second, so the whole step takes seconds, not
minutes), keeps that pool busy with a closed loop of clients, and midway
changes the simulated backend's capacity through the simulator's admin
endpoint, as an operator losing or gaining GPUs would. The width it records
before and after is what the summary shows.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
from rich.console import Console

from lanes.embedded import free_port

ADAPTIVE_POOL = "aifarm-gpu0-dialog"
ADAPTIVE_WORKFLOW = "dialog"
# Fast ticks for a demo; the defaults (12 s scrapes) suit a real fleet.
VLLM = {"kind": "vllm", "interval_seconds": 1.0, "scrape_seconds": 1.0, "timeout_seconds": 1.0}
CAPACITIES = (6, 3)  # the backend's capacity before and after the change (the pool's configured width is 4)
CHAT = {"messages": [{"role": "user", "content": "Plan my week."}], "max_tokens": 16}
# Answers of about half a second in this step: with the mixed workload's 0.14 s ones, the
# gap between one answer and the next request is a large share of each slot, so a scrape
# often catches one slot between requests and "near full" is a matter of luck. Step times
# vary (lognormal, mean unchanged): with every answer the same length, the closed loop's
# batches turned over on a fixed beat of about 0.5 s, and the controller, scraping about
# once a second, could see the same moment of that beat (two answers just ended, their
# successors not yet there: "2 running of 4") tick after tick, and never grow.
STEP_MODEL = {"per_token_ms": 40.0, "distribution": "lognormal", "sigma": 0.3}


@dataclass
class AdaptiveStep:
    pool: str
    model: str
    configured: int
    capacities: tuple[int, int]
    widths: list = field(default_factory=list)  # configured, then the ranges held before and after the change
    changed_at: float | None = None  # time.time() of the capacity change
    answered: int = 0
    failed: int = 0
    # Where the width did not get to the capacity: the controller's most frequent decisions meanwhile.
    shortfalls: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"pool": self.pool, "model": self.model, "configured": self.configured,
                "capacities": list(self.capacities), "widths": self.widths, "answered": self.answered,
                "failed": self.failed, "shortfalls": self.shortfalls}


def with_controller(document: dict, pool: str = ADAPTIVE_POOL) -> bool:
    """Turn the ``vllm`` controller on for ``pool`` in a parsed catalog document. False without that pool."""
    for entry in document.get("pools", []):
        if entry.get("name") == pool:
            entry["controller"] = dict(VLLM)
            return True
    return False


def move_port(document: dict, port: int) -> int:
    """Point the document's models served on ``port`` at a free port instead; returns the new port.

    The simulator serves the example fleet on the port its base URLs name; when
    another program holds that port, the demo serves it elsewhere and applies
    base URLs that say so.
    """
    new = free_port()
    for model in document.get("models", []):
        url = model.get("base_url", "")
        for host in ("127.0.0.1", "localhost"):
            model["base_url"] = url = url.replace(f"//{host}:{port}/", f"//{host}:{new}/")
    return new


def width_range(times: list[float], widths: list[int], start: float, end: float) -> str | None:
    """The widths the lane held between ``start`` and ``end``: "6", or "6..8" while it probes above."""
    held = [w for t, w in zip(times, widths) if start <= t <= end]
    if not held:
        return None
    return str(min(held)) if min(held) == max(held) else f"{min(held)}..{max(held)}"


def decisions_between(decisions: list, start: float, end: float, top: int = 3) -> str:
    """The controller's most frequent decisions between ``start`` and ``end``: "hold (3 running of 4 ...) x9"."""
    seen = Counter((d, r) for t, d, r in decisions if start <= t <= end)
    if not seen:
        return "no decision at all (is a worker running the controller?)"
    return "; ".join(f"{d} ({r}) x{n}" for (d, r), n in seen.most_common(top))


def _note_shortfall(step: AdaptiveStep, series, console: Console, reached, missed: str,
                    start: float, end: float) -> None:
    """Where the phase ended with the width short of ``reached``, say what the controller decided meanwhile."""
    if series.width and reached(series.width[-1]):
        return
    why = decisions_between(series.decisions, start, end)
    step.shortfalls.append(f"{missed}: {why}")
    console.print(f"[yellow]{step.pool} {missed}[/]; the controller decided: {why}")


def _follow(series, reached, phase_seconds: float) -> tuple[float, float]:
    """One phase: half a phase at least, on until ``reached(width)`` (three phases at most,
    so a slow machine shows what it did rather than hang), then half a phase more.

    Returns (when the width got there, the end): the window the summary reports.
    """
    began = time.time()
    time.sleep(phase_seconds / 2)
    while time.time() - began < 3 * phase_seconds and not (series.width and reached(series.width[-1])):
        time.sleep(0.25)
    there = time.time()
    time.sleep(phase_seconds / 2)
    return there, time.time()


def run_adaptive_step(client, sim_url: str, step: AdaptiveStep, timeline, console: Console, *,
                      phase_seconds: float = 6.0, clients: int = 12) -> AdaptiveStep:
    """Keep ``step.pool`` busy; change the backend's capacity midway; record the widths.

    ``step.widths`` ends as [configured, before the change, after it], each
    of the last two the range of widths the lane held once it had got to the
    capacity (at or above it before the change, within one step above it
    after), over the last half phase (the controller keeps probing a step
    above a capacity it measured, so one instant's reading would say less).
    """
    admin = httpx.Client(base_url=sim_url, timeout=5.0)
    stop = threading.Event()
    lock = threading.Lock()

    def closed_loop() -> None:
        while not stop.is_set():
            try:
                ok = client.submit(ADAPTIVE_WORKFLOW, CHAT, deadline=120.0).get(timeout=60) is not None
            except Exception:
                ok = False
            with lock:
                step.answered += ok
                step.failed += not ok

    series = timeline.series[step.pool]
    threads = [threading.Thread(target=closed_loop, daemon=True) for _ in range(clients)]
    try:
        admin.post(f"/admin/models/{step.model}", json=STEP_MODEL).raise_for_status()
        console.print(f"[bold]adaptive width[/]: {step.pool} runs the vllm controller from its configured "
                      f"width {step.configured}; {clients} clients keep it busy; backend capacity "
                      f"{step.capacities[0]}")
        for thread in threads:
            thread.start()
        began = time.time()
        with console.status(f"{step.pool}: following capacity {step.capacities[0]}"):
            reached, step.changed_at = _follow(series, lambda w: w >= step.capacities[0], phase_seconds)
        before = width_range(series.times, series.width, reached, step.changed_at)
        _note_shortfall(step, series, console, lambda w: w >= step.capacities[0],
                        f"did not get to capacity {step.capacities[0]}", began, step.changed_at)
        admin.post(f"/admin/models/{step.model}", json={"capacity": step.capacities[1]}).raise_for_status()
        console.print(f"capacity of {step.model} changed {step.capacities[0]} -> {step.capacities[1]} "
                      f"through the simulator's admin endpoint (width then {series.width[-1]})")
        cut_from = time.time()
        with console.status(f"{step.pool}: following capacity {step.capacities[1]}"):
            reached, ended = _follow(series, lambda w: w <= step.capacities[1] + 1, phase_seconds)
        after = width_range(series.times, series.width, reached, ended)
        _note_shortfall(step, series, console, lambda w: w <= step.capacities[1] + 1,
                        f"did not come down to capacity {step.capacities[1]}", cut_from, ended)
        step.widths = [step.configured, before, after]
    finally:
        stop.set()
        for thread in threads:
            thread.join(70)
        admin.close()
    return step

"""Many processes on one lane, holders killed with SIGKILL, checked from an
independent record (not the lane's own counters)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest
import redis

from lanes import Lane
from lanes.lane.hub import close_hubs
from tests.lane import stress_worker

PROCESSES = 8
PER_PROCESS = 2_700          # 8 x 2,700 = 21,600 acquisitions, plus the replacements'
THREADS = 3
LEASE, RENEW = 3.0, 1.0      # seconds: a busy 2-core machine must not miss renewals
WIDTHS = (4, 2, 6, 3)        # resized through these while the load runs


def load_record(folder: Path) -> list[dict]:
    entries = []
    for path in folder.glob("rec-*.jsonl"):
        pid = int(path.stem.split("-")[1])
        for line in path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # the line a SIGKILL cut short
            entry["pid"] = pid
            entries.append(entry)
    return entries


def width_windows(resizes, initial):
    """[(from, to, widths possibly in force)] from the resize log."""
    windows, current, last = [], initial, 0
    for before, after, width in resizes:
        windows.append((last, before, {current}))
        windows.append((before, after, {current, width}))
        current, last = width, after
    windows.append((last, float("inf"), {current}))
    return windows


def max_width_between(windows, start, end):
    return max(max(w) for a, b, w in windows if a <= end and b >= start)


def check_record(entries, kills, resizes, initial_width):
    acquisitions = [e for e in entries if e["k"] == "a"]
    grants = [e for e in acquisitions if e["o"] == "granted"]
    ends = {e["id"]: e["t"] for e in entries if e["k"] == "r"}
    lost = sum(1 for e in entries if e["k"] == "lost")
    # One outcome per waiter, and every generation given once.
    ids = [g["id"] for g in grants]
    assert len(ids) == len(set(ids)), "a holder id was granted twice"
    generations = [tuple(g["g"]) for g in grants]
    assert len(generations) == len(set(generations)), "a generation was given twice"

    # Never more than W holding (the widths in force between asking and running).
    windows = width_windows(resizes, initial_width)
    events = []
    for grant in grants:
        end = ends.get(grant["id"], kills.get(grant["pid"], float("inf")))
        events.append((grant["t1"], 1, grant))
        events.append((end, -1, None))
    events.sort(key=lambda e: (e[0], e[1]))  # an end at the same instant comes first
    holding = 0
    worst = 0
    for at, delta, grant in events:
        holding += delta
        if delta == 1:
            allowed = max_width_between(windows, grant["t0"], grant["t1"])
            assert holding <= allowed, f"{holding} holding at {at} but width was at most {allowed}"
            worst = max(worst, holding)

    # Generations increase with time: nobody who asked after a grant got an older generation.
    by_generation = sorted(grants, key=lambda g: tuple(g["g"]))
    latest_ask = 0
    for grant in by_generation:
        assert latest_ask <= grant["t1"], "a later request got an older generation"
        latest_ask = max(latest_ask, grant["t0"])

    # Priority order and FIFO: a waiter queued before B even asked, at the same
    # or higher priority, is granted before B (grant order = generation order).
    prefix_max_ask = {p: 0 for p in range(3)}  # latest ask among earlier grants of priority >= p
    violations = 0
    for grant in by_generation:
        if grant["tq"] is not None and prefix_max_ask[grant["p"]] > grant["tq"]:
            violations += 1
        for p in range(grant["p"] + 1):
            prefix_max_ask[p] = max(prefix_max_ask[p], grant["t0"])
    assert violations == 0, f"{violations} grants overtook an earlier waiter of the same or higher priority"
    return {"acquisitions": len(acquisitions), "grants": len(grants), "lost": lost, "worst": worst,
            "timeouts": sum(e["o"] == "timeout" for e in acquisitions),
            "cancels": sum(e["o"] == "cancel" for e in acquisitions)}


def holding_process(client, lane, procs):
    """A live worker process that holds a slot right now, if any."""
    holders = [h.decode() for h in client.zrange(lane.keys.all()[1], 0, -1)]
    pids = {int(h.split("-")[0]) for h in holders}
    for proc in procs:
        if proc.pid in pids and proc.is_alive():
            return proc
    return None


def spawn(ctx, url, key, folder, seed):
    proc = ctx.Process(target=_child, args=(url, key, str(folder), seed))
    proc.start()
    return proc


def _child(url, key, folder, seed):
    stress_worker.run(url, key, WIDTHS[0], LEASE, RENEW, PER_PROCESS, THREADS,
                      f"{folder}/rec-{os.getpid()}.jsonl", seed, hold_max=0.002)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_many_processes_never_over_admit_keep_priority_order_and_leak_nothing(one_redis_url, tmp_path):
    key = "pool:stress"
    client = redis.Redis.from_url(one_redis_url, socket_timeout=10)
    lane = Lane(client, key, width=WIDTHS[0], lease_seconds=LEASE, renew_seconds=RENEW)
    lane.provision()
    ctx = multiprocessing.get_context("spawn")
    procs = [spawn(ctx, one_redis_url, key, tmp_path, seed) for seed in range(PROCESSES)]
    kills: dict[int, int] = {}
    resizes: list[tuple[int, int, int]] = []
    started = time.monotonic()
    step = 0
    kill_times = [4.0, 8.0]
    while any(p.is_alive() for p in procs):
        time.sleep(0.1)
        elapsed = time.monotonic() - started
        for when in list(kill_times):
            victim = holding_process(client, lane, procs) if elapsed >= when else None
            if victim is not None:
                # Killed while it holds a slot: the slot must come back by lease expiry.
                os.kill(victim.pid, signal.SIGKILL)
                kills[victim.pid] = time.monotonic_ns()
                kill_times.remove(when)
                procs.append(spawn(ctx, one_redis_url, key, tmp_path, 100 + len(procs)))
        if int(elapsed / 1.5) > step:
            step = int(elapsed / 1.5)
            width = WIDTHS[step % len(WIDTHS)]
            before = time.monotonic_ns()
            lane.resize(width)
            resizes.append((before, time.monotonic_ns(), width))
        assert elapsed < 360, "stress load did not finish in time"
    for proc in procs:
        proc.join()
    entries = load_record(tmp_path)
    summary = check_record(entries, kills, resizes, WIDTHS[0])
    assert summary["acquisitions"] >= 20_000, summary
    assert len(kills) == 2
    # No slot leaked: once the killed holders' leases expire the lane is empty.
    time.sleep(LEASE + 0.5)
    stats = lane.stats()
    assert stats.in_flight == 0 and stats.queued_total == 0, stats
    assert stats.expired >= 1, "the killed holders' slots came back by lease expiry"
    print("stress summary", summary, "lane counters", stats.grants, stats.timeouts, stats.cancels, stats.expired)
    close_hubs(client)
    client.close()

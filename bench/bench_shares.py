"""What the failover share costs a request: walks with the share on vs off, in one run.

    python bench/bench_shares.py            # 3 interleaved rounds of 400 walks each way
    python bench/bench_shares.py --smoke    # a quick pass that proves it runs

The walker runs in this process (no Celery: the share's cost is in the walk)
against its own embedded Redis and ``lanes sim`` in its own process (capacity
64, 5 ms service), on a two-candidate workflow whose primary is always free.
"on" is the default share (one script call to draw, one to record the
primary's outcome); "off" is the same workflow with ``failover = {enabled =
false}``. Printed: walks/s on and off (median of the rounds), the ratio of
those two medians and, separately, the median of the per-round ratios (each
round's on and off taken minutes apart at most); the added milliseconds per
request; and one draw (``ShareController.choose``) against one ``PING`` on the
same Redis, interleaved, 1,000 each (200 with ``--smoke``). A speed claim
belongs here, never in a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from lanes.catalog import apply_document, load_routing, open_catalog  # noqa: E402
from lanes.embedded import EmbeddedRedis  # noqa: E402
from lanes.priority import Priority  # noqa: E402
from lanes.routing.request import RouteRequest  # noqa: E402
from lanes.routing.runtime import Runtime, provision_lanes  # noqa: E402
from lanes.routing.walker import Walker  # noqa: E402
from lanes.settings import Settings  # noqa: E402
from tests.e2e.harness import RemoteSim  # noqa: E402

CHAT = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}


def walks(runtime: Runtime, workflow: str, n: int) -> float:
    start = time.monotonic()
    for i in range(n):
        request = RouteRequest(task_id=f"{workflow}-{i}-{time.monotonic_ns()}", workflow=workflow, payload=CHAT,
                               priority=Priority.INTERACTIVE, deadline=None, submitted_at=time.time())
        Walker(runtime).walk(request)
    return time.monotonic() - start


def draw_vs_ping(runtime: Runtime, url: str, n: int) -> dict:
    """p50 of one share draw and of one PING, taken in turns on the same Redis."""
    route = runtime.workflow("on")
    client = redis.Redis.from_url(url)
    draws, pings = [], []
    for _ in range(n):
        t = time.perf_counter()
        runtime.shares.choose(route)
        draws.append(time.perf_counter() - t)
        t = time.perf_counter()
        client.ping()
        pings.append(time.perf_counter() - t)
    client.close()
    draw, ping = statistics.median(draws), statistics.median(pings)
    return {"draw_p50_ms": round(draw * 1000, 3), "ping_p50_ms": round(ping * 1000, 3),
            "draw_over_ping": round(draw / ping, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    n, rounds = (50, 1) if args.smoke else (400, 3)
    with tempfile.TemporaryDirectory() as folder:
        server = EmbeddedRedis(Path(folder) / "redis")
        server.ensure()
        sim = RemoteSim(["a:64:5", "b:64:5"])
        try:
            settings = Settings(state_dir=Path(folder), redis_url=server.url, events_enabled=False)
            engine = open_catalog(settings)
            apply_document(engine, {
                "pools": [{"name": "pa", "width": 64}, {"name": "pb", "width": 64}],
                "models": [{"name": "a", "base_url": sim.base_url, "pool": "pa"},
                           {"name": "b", "base_url": sim.base_url, "pool": "pb"}],
                "workflows": [{"name": "on", "candidates": ["a", "b"]},
                              {"name": "off", "candidates": ["a", "b"], "failover": {"enabled": False}}],
            })
            provision_lanes(redis.Redis.from_url(server.url), settings, load_routing(engine))
            runtime = Runtime(settings, redis_url=server.url, engine=engine)
            try:
                walks(runtime, "on", 20), walks(runtime, "off", 20)  # warm both paths
                on_s, off_s = [], []
                for _ in range(rounds):
                    on_s.append(walks(runtime, "on", n))
                    off_s.append(walks(runtime, "off", n))
                share = runtime.shares.store.read("on")
                draw = draw_vs_ping(runtime, server.url, 200 if args.smoke else 1000)
            finally:
                runtime.close()
        finally:
            sim.stop()
            server.stop()
    ratios = [off / on for on, off in zip(on_s, off_s)]
    on_rate, off_rate = n / statistics.median(on_s), n / statistics.median(off_s)
    result = {
        "walks": n, "rounds": rounds,
        "on_walks_per_s": round(on_rate, 1),
        "off_walks_per_s": round(off_rate, 1),
        "ratio_of_median_rates": round(on_rate / off_rate, 3),  # on_walks_per_s / off_walks_per_s
        "ratio_on_off_median": round(statistics.median(ratios), 3),  # the median of the per-round ratios
        "ratios": [round(r, 3) for r in ratios],
        "added_ms_per_walk": round((statistics.median(on_s) - statistics.median(off_s)) / n * 1000, 3),
        "share_after": share.share if share else None,
        **draw,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

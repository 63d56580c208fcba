"""How long `lanes --help` takes to start, against a bare `python -c pass`.

    python bench/bench_cli.py            # 15 runs of each, interleaved
    python bench/bench_cli.py --smoke    # 3 runs of each

Every command pays this start-up before it does anything. The figure that
matters is the difference: what Lanes adds on top of starting Python (goal:
`lanes --help` under 0.3 s; the machine's own Python start is the baseline
measured in the same run). Runs are interleaved so machine load hits both,
and each run's CPU time (user + system, from the kernel's accounting of the
child) is reported beside its wall time: on a busy machine the wall time
mostly measures the wait for a core.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

LANES = [sys.executable, "-m", "lanes.cli", "--help"]
BARE = [sys.executable, "-c", "pass"]


def timed(command: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=Path(__file__).resolve().parent.parent)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_cli.py")
    parser.add_argument("--smoke", action="store_true", help="3 runs of each instead of 15")
    args = parser.parse_args(argv)
    runs = 3 if args.smoke else 15
    timed(LANES)  # warm the file cache and the bytecode
    lanes, bare = [], []
    for _ in range(runs):
        lanes.append(timed(LANES))
        bare.append(timed(BARE))
    for label, index in (("wall", 0), ("cpu", 1)):
        mine = [run[index] for run in lanes]
        base = [run[index] for run in bare]
        mine_p50, base_p50 = statistics.median(mine), statistics.median(base)
        print(f"{label:4}  lanes --help p50 {mine_p50 * 1000:6.1f} ms (min {min(mine) * 1000:6.1f})  "
              f"python -c pass p50 {base_p50 * 1000:6.1f} ms (min {min(base) * 1000:6.1f})  "
              f"added {(mine_p50 - base_p50) * 1000:6.1f} ms  ratio {mine_p50 / base_p50:.2f}x")
    print(f"({runs} interleaved runs each; goal: lanes --help under 300 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run every benchmark program in this folder, one after another.

    python bench/run_all.py            # full runs
    python bench/run_all.py --smoke    # quick passes (what CI runs: no thresholds)

Benchmarks are programs, not tests: each prints its figures as ratios against
baselines measured in the same run; docs/BENCHMARKS.md records them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAMS = ["bench_lane.py", "bench_routing.py", "bench_shares.py", "bench_control.py", "bench_cli.py", "bench_peers.py",
            "bench_waiting.py", "bench_sim.py", "lane_script_time.py", "api_body_memory.py", "soak.py"]
# A full run's arguments of its own: the soak's default is half an hour.
FULL_ARGS = {"soak.py": ["--minutes", "10"]}


def main(argv: list[str]) -> int:
    failed = []
    for name in PROGRAMS:
        print(f"=== {name} {' '.join(argv)}", flush=True)
        args = argv or FULL_ARGS.get(name, [])
        code = subprocess.call([sys.executable, str(HERE / name), *args], cwd=HERE.parent)
        if code != 0:
            failed.append(f"{name} (exit {code})")
    if failed:
        print(f"benchmarks failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

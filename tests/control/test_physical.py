"""The `vllm` law in front of the simulator's physical engines (bench/control_physical.py):
decode steps that slow as the batch grows, ``max_num_seqs`` and the KV cache as limits."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from control_physical import PhysicalScenario, simulate_physical  # noqa: E402

from lanes.catalog.controllers import normalise  # noqa: E402
from lanes.control.laws import compose  # noqa: E402

VLLM = {"vllm": normalise({}, "vllm")}


def law(s, b, memo):
    return compose(VLLM, s, b, memo).width


def test_slower_calls_in_a_wider_batch_are_not_taken_for_work_waiting_and_the_width_reaches_the_engines_bound():
    # Two engines of max_num_seqs 256, a reading every decision. Calls at 64 running take about
    # 1.5 x those at 8; read against the yardstick taken at 8, the lane's answers "showed" 25
    # run at once and the width swung 22 <-> 64 (before the same decision's reading, which saw
    # 64 run and none wait, overruled them).
    run = simulate_physical(PhysicalScenario("physical", cycles=24), law)
    assert max(run.widths) >= 460 and min(run.widths[-3:]) >= 460, run.widths
    assert max(run.running[-3:]) >= 460, run.running


def test_a_drained_cut_is_not_read_as_a_backend_that_runs_a_handful():
    # The field's cadence: a scrape at most every 12 s, 3-6 s old. A saturation cut from 512 to
    # 178 leaves 488 in flight draining; their few answers once read as "7 run at once".
    run = simulate_physical(PhysicalScenario("field", cycles=12, scrape_s=12.0, lag_range=(3.0, 6.0)), law)
    assert min(run.widths[5:8]) >= 100, run.widths

"""Failing closed is visible: `catalog apply`, the API's PATCH and `lanes check` warn;
`lanes top` shows it in 80 columns with the pool's name and the reason."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from lanes.cli.top_view import Frame, render
from tests.api.conftest import AUTH, make_api  # noqa: F401  (the fixture)
from tests.cli.conftest import lanes, user_env

CONTROLLED = {
    "pools": [{"name": "gpu-controlled", "width": 4, "ceiling": 16, "controller": {"kind": "vllm"}},
              {"name": "gpu-fixed", "width": 4, "ceiling": 16}],
    "models": [{"name": "m", "base_url": "http://127.0.0.1:9/v1", "pool": "gpu-controlled"},
               {"name": "n", "base_url": "http://127.0.0.1:9/v1", "pool": "gpu-fixed"}],
    "workflows": [{"name": "chat", "candidates": ["m"]}],
}


@pytest.mark.parametrize("gate", [None, "0.9"])
@pytest.mark.slow
def test_catalog_apply_and_lanes_check_warn_about_a_pool_that_fails_closed(tmp_path, gate):
    path = tmp_path / "catalog.yaml"  # JSON is YAML
    path.write_text(json.dumps(CONTROLLED))
    env = user_env(tmp_path, LANES_STATE_DIR=str(tmp_path / "state"),
                   **({"LANES_MEMORY_GATE_HIGH": gate} if gate else {}))
    applied = lanes("catalog", "apply", str(path), env=env)
    assert applied.returncode == 0, applied.stderr
    checked = lanes("check", "--no-redis", env=env)
    warned = [line for line in applied.stderr.splitlines() if line.startswith("warning: ")]
    if gate:
        assert not warned and "fail-closed" not in checked.stdout
        return
    # Only the pool whose controllers could go above its width; it names the clamp and the fix.
    assert warned == ["warning: pool gpu-controlled: fail-closed: ceiling 16 clamped to the configured width 4 "
                      "(no memory gate: set LANES_MEMORY_GATE_HIGH on the workers)"]
    assert "warning: pool gpu-controlled: fail-closed" in checked.stdout
    assert "gpu-fixed" not in checked.stdout.split("warning", 1)[-1]


def test_the_api_patch_that_makes_a_pool_fail_closed_says_so(make_api, db_url):
    api = make_api(database_url=db_url)
    answer = api.patch("/v1/pools/gpu-a", json={"controller": {"kind": "overload"}, "ceiling": 8}, headers=AUTH)
    assert answer.status_code == 200, answer.text
    assert answer.json()["warnings"] == [
        "pool gpu-a: fail-closed: ceiling 8 clamped to the configured width 2 "
        "(no memory gate: set LANES_MEMORY_GATE_HIGH on the workers)"]
    calm = api.patch("/v1/pools/gpu-a", json={"controller": None}, headers=AUTH)
    assert calm.json()["warnings"] == []


def test_lanes_top_shows_the_pool_that_fails_closed_and_why_in_80_columns():
    reason = ("fail-closed: ceiling 16 clamped to the configured width 4 "
              "(no memory gate: set LANES_MEMORY_GATE_HIGH on the workers)")
    row = {"pool": "gpu-with-a-long-name", "in_flight": 3, "width": 4, "queued": {"interactive": 0, "user_tool": 0,
                                                                                  "background": 0},
           "wait_p95_ms": None, "mean_hold_ms": None, "controllers": {"vllm": {}}, "fail_closed": reason}
    out = io.StringIO()
    Console(file=out, width=80, force_terminal=False).print(render(Frame(0.0, [row], {}), source="test"))
    text = out.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines())
    flat = " ".join(text.split())
    assert "gpu-with-a-long-name" in flat and "LANES_MEMORY_GATE_HIGH" in flat and "clamped" in flat

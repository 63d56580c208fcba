"""The scripts as shipped: headers, key layout, exports."""

from __future__ import annotations

from importlib import resources

import pytest

import lanes
import lanes.lane
from lanes.lane._lua import NAMES, script_text
from lanes.lane.keys import LaneKeys, lane_of_meta, meta_pattern


@pytest.mark.parametrize("name", NAMES)
def test_every_script_opens_with_a_header_naming_its_keys_and_argv(name):
    body = (resources.files("lanes.lane") / "scripts" / f"{name}.lua").read_text()
    head = body.split("\n\n")[0]
    assert head.startswith(f"-- {name}.lua:")
    assert "KEYS" in head and "ARGV[1]" in head
    assert "KEYS[" not in body.replace("KEYS: ", ""), "keys come from lib_base.lua's names, never built"
    text = script_text(name)
    assert text.startswith(f"-- {name}.lua:")
    assert "local K_META" in text and "--! include" not in text
    # Every helper file appears at most once (includes are deduplicated).
    assert text.count("local K_META") == 1 and text.count("local function load_state") <= 1


@pytest.mark.parametrize("name", ["acquire", "release"])
def test_the_hot_scripts_run_their_fast_path_before_any_slow_path_helper(name):
    # A script call runs the top level of everything included: the fast path
    # must not pay for the closures of the reap and handoff helpers.
    text = script_text(name)
    fast_end = text.index("local function load_state")
    assert text.index("return {'granted'" if name == "acquire" else "return {released, 0}") < fast_end
    assert text[:fast_end].count("\nlocal function") <= 3  # now_us, now_ms and fmt only


def test_every_key_of_a_lane_shares_one_hash_tag_and_the_prefix_is_versioned():
    keys = LaneKeys("lanes:v2", "pool:42").all()
    assert len(keys) == 8 and all(k.startswith("lanes:v2:{pool:42}:") for k in keys)
    assert lane_of_meta("lanes:v2", keys[0]) == "pool:42"
    assert meta_pattern("lanes:v2") == "lanes:v2:{*}:meta"


def test_the_public_names_are_exported_from_lanes():
    for name in lanes.lane.__all__:
        if name != "scan_lane_keys":
            assert name in lanes.__all__ and getattr(lanes, name) is getattr(lanes.lane, name)


def test_scan_lane_keys_lists_every_lane(make_lane):
    from lanes.lane import scan_lane_keys

    make_lane("pool:a")
    lane = make_lane("pool:b")
    assert scan_lane_keys(lane.client, lane.prefix) == ["pool:a", "pool:b"]

"""The front door of ``lanes.sim`` exports what it documents."""

from __future__ import annotations

import pytest

import lanes.sim
from lanes.errors import InvalidInput
from lanes.sim import SimModel, parse_model_spec


def test_every_exported_name_exists():
    for name in lanes.sim.__all__:
        assert hasattr(lanes.sim, name), name


def test_a_model_is_keyword_only_and_validated():
    with pytest.raises(TypeError):
        SimModel("m")  # type: ignore[misc]
    with pytest.raises(InvalidInput, match="capacity 'x'.*overflow 'spill'"):
        SimModel(name="m", capacity="x", overflow="spill")  # type: ignore[arg-type]
    assert SimModel(name="m", capacity=2) == SimModel(name="m", capacity=2)


def test_model_specs_take_their_numbers_from_the_right():
    assert parse_model_spec("qwen3:8b:4") == SimModel(name="qwen3:8b", capacity=4)
    assert parse_model_spec("m:4:50") == SimModel(name="m", capacity=4, service_ms=50.0)
    assert parse_model_spec("ollama:llama3:8b:2:12.5").name == "ollama:llama3:8b"


def test_the_simulator_needs_distinct_models():
    with pytest.raises(InvalidInput, match="listed twice"):
        lanes.sim.Simulator([SimModel(name="m"), SimModel(name="m")])
    with pytest.raises(InvalidInput, match="at least one model"):
        lanes.sim.Simulator([])

"""A simulated vLLM fleet over real HTTP, for tests, benchmarks and the demo.

::

    from lanes.sim import Simulator, SimModel

    with Simulator([SimModel(name="m", capacity=4, service_ms=50.0)]) as sim:
        httpx.post(sim.base_url + "/chat/completions", json={"model": "m", "messages": []})
        assert sim.stats()["m"]["max_running"] <= 4

``lanes sim`` runs the same server as a process. :class:`EngineCore` is the
engine alone, on an injected clock, for harnesses that step time themselves.
"""

from lanes.sim.engine import EngineCore, SimRequest
from lanes.sim.model import H100_LLAMA_8B, SimModel, StepTimes, step_seconds
from lanes.sim.server import Simulator
from lanes.sim.specs import CatalogModels, catalog_models, parse_model_spec

__all__ = [
    "CatalogModels",
    "EngineCore",
    "H100_LLAMA_8B",
    "SimModel",
    "SimRequest",
    "StepTimes",
    "Simulator",
    "catalog_models",
    "parse_model_spec",
    "step_seconds",
]

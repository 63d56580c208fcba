"""A simulated vLLM fleet over real HTTP, for tests, benchmarks and the demo.

::

    from lanes.sim import Simulator, SimModel

    with Simulator([SimModel(name="m", capacity=4, service_ms=50.0)]) as sim:
        httpx.post(sim.base_url + "/chat/completions", json={"model": "m", "messages": []})
        assert sim.stats()["m"]["max_running"] <= 4

``lanes sim`` runs the same server as a process.
"""

from lanes.sim.model import SimModel, Timing, knee_factor, sample_timing
from lanes.sim.server import Simulator
from lanes.sim.specs import CatalogModels, catalog_models, parse_model_spec

__all__ = [
    "CatalogModels",
    "SimModel",
    "Simulator",
    "Timing",
    "catalog_models",
    "knee_factor",
    "parse_model_spec",
    "sample_timing",
]

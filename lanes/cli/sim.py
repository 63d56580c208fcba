"""``lanes sim``: run the simulated vLLM fleet as a process until SIGINT/SIGTERM."""

from __future__ import annotations

import signal
import threading
from dataclasses import replace
from pathlib import Path

import click

from lanes.errors import InvalidInput
from lanes.sim import SimModel, Simulator, catalog_models, parse_model_spec
from lanes.sim.specs import SPEC_HELP

DEFAULT_PORT = 8700


@click.command(name="sim")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=None, help=f"Main port: models given with --model, /admin, /metrics. Default {DEFAULT_PORT}, or the lowest catalog port.")
@click.option("--model", "model_specs", multiple=True, metavar="SPEC", help=f"A chat model, {SPEC_HELP}. Repeatable.")
@click.option("--embedding-model", "embedding_specs", multiple=True, metavar="SPEC", help="An embedding model, NAME:CAPACITY[:SERVICE_MS]. Repeatable.")
@click.option("--catalog", "catalog_file", default=None, metavar="FILE", help="Serve every local model of a catalog file (.toml/.yaml) on its base_url's port; capacity = its pool's width.")
@click.option("--overflow", type=click.Choice(["queue", "reject"]), default="queue", show_default=True, help="Past capacity: queue FIFO (vLLM) or reject.")
@click.option("--reject-status", type=int, default=529, show_default=True, help="Status of a rejection (529, 429, 503...).")
@click.option("--max-queue", type=int, default=None, help="Reject once this many wait (default: unbounded).")
@click.option("--service-ms", type=float, default=None, help="Fixed total service time; overrides token timing.")
@click.option("--ttft-ms", type=float, default=50.0, show_default=True, help="Time to the first token.")
@click.option("--per-token-ms", type=float, default=10.0, show_default=True, help="Time between tokens.")
@click.option("--tokens", type=int, default=16, show_default=True, help="Tokens per answer (capped by max_tokens).")
@click.option("--distribution", type=click.Choice(["fixed", "lognormal"]), default="fixed", show_default=True)
@click.option("--sigma", type=float, default=0.5, show_default=True, help="Log-sigma of the lognormal service time.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the service-time draws.")
@click.option("--knee", type=float, default=0.8, show_default=True, help="Load (running/capacity) past which answers slow down.")
@click.option("--knee-slowdown", type=float, default=None, help="Extra service time at full load (default 0.5; 0 with --service-ms).")
@click.option("--defer-ms", type=float, default=0.0, show_default=True, help="Time each request waits with reason 'deferred'.")
@click.option("--embedding-ms", type=float, default=5.0, show_default=True, help="Service time of an embeddings request.")
@click.option("--embedding-dim", type=int, default=8, show_default=True, help="Length of the embedding vectors.")
def command(host, port, model_specs, embedding_specs, catalog_file, **service) -> None:
    """Run a simulated vLLM fleet (OpenAI chat and embeddings, vLLM /metrics,
    /admin/stats) until interrupted.

    \b
      lanes sim --model chat-small:4:50 --model chat-big:2
      lanes sim --catalog examples/aifarm.toml --overflow reject --reject-status 529
    """
    template = SimModel(name="_", **service)
    models = [parse_model_spec(s, template) for s in model_specs]
    models += [parse_model_spec(s, replace(template, kind="embedding")) for s in embedding_specs]
    skipped: list[str] = []
    if catalog_file is not None:
        found = catalog_models(Path(catalog_file), template)
        models += found.models
        skipped = found.skipped
    if not models:
        raise InvalidInput(f"nothing to simulate: give --model {SPEC_HELP} or --catalog FILE")
    if port is None:
        catalog_ports = [m.port for m in models if m.port is not None]
        port = min(catalog_ports) if catalog_ports and len(catalog_ports) == len(models) else DEFAULT_PORT

    sim = Simulator(models, host=host, port=port)
    sim.start()
    try:
        click.echo(f"lanes sim listening on {sim.url} (admin: {sim.url}/admin/stats, metrics: {sim.url}/metrics)")
        for name, engine in sim.fleet.engines.items():
            m = engine.model
            click.echo(f"  {name}: {m.kind}, capacity {m.capacity}, overflow {m.overflow}, {sim.base_url_for(name)}")
        for entry in skipped:
            click.echo(f"  skipped, not on this machine: {entry}")
        _wait_for_signal()
    finally:
        sim.stop()
    click.echo("lanes sim stopped")


def _wait_for_signal() -> None:
    stop = threading.Event()

    def handler(signum, frame) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    # A timed wait keeps the main thread returning to the interpreter, where
    # Python runs signal handlers.
    while not stop.wait(0.5):
        pass

"""``lanes sim``: run the simulated vLLM fleet as a process until SIGINT/SIGTERM."""

from __future__ import annotations

import signal
import threading
from dataclasses import replace
from pathlib import Path

import click

from lanes.errors import InvalidInput
from lanes.sim import H100_LLAMA_8B, SimModel, Simulator, catalog_models, parse_model_spec
from lanes.sim.model import FLAVORS
from lanes.sim.specs import SPEC_HELP

DEFAULT_PORT = 8700


@click.command(name="sim")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=None, help=f"Main port: models given with --model, /admin, /metrics. Default {DEFAULT_PORT}, or the lowest catalog port.")
@click.option("--model", "model_specs", multiple=True, metavar="SPEC", help=f"A chat model, {SPEC_HELP} (SERVICE_MS: a fixed, non-physical time; without it, the step law). Repeatable.")
@click.option("--embedding-model", "embedding_specs", multiple=True, metavar="SPEC", help="An embedding model, NAME:CAPACITY[:SERVICE_MS]. Repeatable.")
@click.option("--catalog", "catalog_file", default=None, metavar="FILE", help="Serve every local model of a catalog file (.toml/.yaml) on its base_url's port; capacity = its pool's width.")
@click.option("--overflow", type=click.Choice(["queue", "gateway"]), default="queue", show_default=True, help="queue: vLLM (unbounded unless --max-num-queued-*; then 503). gateway: answer --reject-status when every engine is busy, as NVIDIA Dynamo does (by its thresholds below; without them, at capacity).")
@click.option("--reject-status", type=int, default=529, show_default=True, help="The gateway mode's answer when full (529, 429...).")
@click.option("--gateway-kv-threshold", type=float, default=None, help="Gateway: an engine is busy past this share of its KV blocks (Dynamo's --active-decode-blocks-threshold).")
@click.option("--gateway-prefill-tokens-threshold", type=int, default=None, help="Gateway: an engine is busy past this many prompt tokens to prefill (Dynamo's --active-prefill-tokens-threshold).")
@click.option("--max-num-queued-reqs", type=int, default=None, help="vLLM's limit on unfinished sequences (running + waiting, n counted); past it, 503 (default: unbounded; needs --metrics-flavor current).")
@click.option("--max-num-queued-tokens", type=int, default=None, help="vLLM's limit on the prompt tokens of requests still in prefill; at it, 503 (an idle engine admits any prompt; default: unbounded).")
@click.option("--kv-blocks", type=int, default=4096, show_default=True, help="KV-cache blocks per engine; a prompt waits until its blocks are free.")
@click.option("--block-size", type=int, default=16, show_default=True, help="Tokens per KV block.")
@click.option("--max-num-batched-tokens", type=int, default=8192, show_default=True, help="Token budget of one engine step (prefill chunks and decodes).")
@click.option("--max-model-len", type=int, default=None, help="Longest prompt + answer (default: the whole KV cache); /v1/models reports it.")
@click.option("--service-ms", type=float, default=None, help="Fixed total service time, whatever the batch: NOT physical (routing benchmarks only); overrides the step law.")
@click.option("--per-token-ms", type=float, default=H100_LLAMA_8B.per_token_ms, show_default=True, help="Step law a: a step's fixed cost (default: Llama-3.1-8B on one H100).")
@click.option("--per-seq-ms", type=float, default=H100_LLAMA_8B.per_seq_ms, show_default=True, help="Step law b: added per sequence in the step.")
@click.option("--context-ms-per-1k", type=float, default=H100_LLAMA_8B.context_ms_per_1k, show_default=True, help="Step law c: added per 1000 tokens of context the step attends.")
@click.option("--prefill-ms-per-token", type=float, default=H100_LLAMA_8B.prefill_ms_per_token, show_default=True, help="Added per prompt token the step processes.")
@click.option("--ttft-ms", type=float, default=0.0, show_default=True, help="A fixed extra cost of a step that holds prefill work.")
@click.option("--tokens", type=int, default=16, show_default=True, help="Tokens per answer (capped by max_tokens).")
@click.option("--distribution", type=click.Choice(["fixed", "lognormal"]), default="fixed", show_default=True)
@click.option("--sigma", type=float, default=0.5, show_default=True, help="Log-sigma of the lognormal service time.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the service-time draws.")
@click.option("--defer-ms", type=float, default=0.0, show_default=True, help="Time each request stays unschedulable (waiting reason 'deferred').")
@click.option("--tokenize-ms", type=float, default=0.0, show_default=True, help="Time before the engine sees a request (in no gauge).")
@click.option("--embedding-ms", type=float, default=5.0, show_default=True, help="Service time of an embeddings request.")
@click.option("--embedding-dim", type=int, default=8, show_default=True, help="Length of the embedding vectors.")
@click.option("--metrics-flavor", type=click.Choice(FLAVORS), default="current", show_default=True, help="Which vLLM release's /metrics to imitate.")
@click.option("--metrics-lag-s", type=float, default=3.0, show_default=True, help="Delay before a step's gauges show in /metrics (/admin/stats is exact).")
@click.option("--replicas", type=int, default=1, show_default=True, help="Engines behind each model's address.")
@click.option("--data-parallel", is_flag=True, help="Replicas are data-parallel ranks of one server (engine=\"0\"..), not servers behind a load balancer.")
@click.option("--balancer-status", type=click.Choice(["502", "503"]), default="502", show_default=True, help="What the balancer in front of replicas answers for one whose server is gone (502 nginx, 503 Envoy/HAProxy).")
@click.option("--keep-alive-on-engine-death", is_flag=True, help="A dead engine's server keeps answering (500s, /health 503), as with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH; by default it exits.")
@click.option("--exit-after-death-s", type=float, default=5.0, show_default=True, help="How soon a dead engine's server exits if no request reaches it first (vLLM's watchdog: 5 s).")
def command(host, port, model_specs, embedding_specs, catalog_file, balancer_status, **service) -> None:
    """Run a simulated vLLM fleet (OpenAI chat and embeddings, vLLM /metrics,
    /admin/stats) until interrupted.

    \b
      lanes sim --model chat-small:4:50 --model chat-big:2
      lanes sim --catalog examples/aifarm.toml --overflow gateway --reject-status 529

    \b
    Change a model while it runs (any setting above, in snake_case, plus
    fail_next, hang_next and error_next):
      curl -X POST localhost:8700/admin/models/chat-small -d '{"fail_next": 3}'
          the next 3 requests answer fail_status (default 500)
      curl -X POST localhost:8700/admin/models/chat-small -d '{"fail_rate": 0.2, "fail_status": 503}'
      curl -X POST localhost:8700/admin/models/chat-small -d '{"hang_next": 1, "hang_s": 60}'
          the next request holds its slot 60 s before it starts
      curl -X POST localhost:8700/admin/models/chat-small -d '{"error_next": 1}'
          the next answer fails after its first token (HTTP 200, then an error frame)
      curl -X POST localhost:8700/admin/models/chat-small -d '{"down": true}'
          a dead engine: 500 per request, 503 on /health, and its port closes within
          5 s (at once after a 500) unless --keep-alive-on-engine-death;
          '{"down": false}' revives it (from another port, or with keep-alive)
      curl -X POST localhost:8700/admin/models/chat-small -d '{"capacity": 8}'
      curl localhost:8700/admin/stats            exact counts (gauges in /metrics lag)
      curl -X POST localhost:8700/admin/reset -d '{"config": true}'
    """
    template = SimModel(name="_", balancer_status=int(balancer_status), **service)
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

"""The simulator's physics, measured over HTTP: what a client of ``lanes sim`` sees.

    python bench/bench_sim.py            # every figure (about a minute)
    python bench/bench_sim.py --smoke    # the per-token figures only

Figures (each from the simulator's own histograms, so the machine's load does
not move them, or from status codes):

- per-token time of one batch of 8 streams at ``max_num_seqs`` 8 and 64: the
  same batch must cost the same, whatever the limit;
- per-token time at batch 1, 16 and 64 (``max_num_seqs`` 256): it grows with
  the batch and its context, from the first request;
- fixed mode (``service_ms`` 200, capacity 16): slowest of 1, 16, 17 at once;
- admission: one 600-token prompt at ``max_num_queued_tokens`` 500 on an idle
  engine; a third request while two only decode;
- a dead engine: what a caller gets 7 s after the engine died.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from lanes.sim import EngineCore, SimModel, SimRequest, Simulator  # noqa: E402
from lanes.sim.model import new_rng  # noqa: E402


def engine_run(model: SimModel, batch: int, tokens: int, prompt: int = 1) -> tuple[float, float]:
    """``batch`` requests arriving together on one engine, on its own clock (no HTTP,
    no event loop): (mean inter-token ms, slowest end-to-end ms)."""
    core = EngineCore(model, new_rng(model))
    fixed = model.service_ms / 1000 if model.service_ms is not None else None
    requests = [SimRequest(prompt_tokens=prompt, max_tokens=tokens, arrived=0.0, service_s=fixed) for _ in range(batch)]
    for request in requests:
        core.add(request)
    now = 0.0
    core.advance(now)
    for _ in range(1_000_000):
        wakeup = core.next_wakeup(now)
        if wakeup is None:
            break
        now = wakeup
        core.advance(now)
    c = core.counters
    itl = c.inter_token.sum / c.inter_token.count * 1000 if c.inter_token.count else float("nan")
    return itl, max(r.last_token_at for r in requests) * 1000


def histogram_mean(metrics: str, name: str) -> float | None:
    total = count = None
    for line in metrics.splitlines():
        if line.startswith(name + "_sum{"):
            total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_count{"):
            count = (count or 0.0) + float(line.rsplit(" ", 1)[1])
    return total / count if count else None


async def streams(sim: Simulator, model: str, n: int, tokens: int, prompt_words: int = 1,
                  release_at: int | None = None) -> list[float]:
    """``n`` concurrent streams; each one's seconds from sending to its last byte.

    ``release_at``: the model starts at capacity 0; once all ``n`` wait, its
    capacity is raised to ``release_at``, so the batch runs whole from its first
    step however slowly this machine sends the requests."""
    body = {"model": model, "messages": [{"role": "user", "content": "w " * prompt_words}],
            "max_tokens": tokens, "stream": True}

    async def one(client: httpx.AsyncClient) -> float:
        started = time.monotonic()
        async with client.stream("POST", "/chat/completions", json=body) as answer:
            async for _ in answer.aiter_bytes():
                pass
        return time.monotonic() - started

    limits = httpx.Limits(max_connections=n + 4)
    async with httpx.AsyncClient(base_url=sim.base_url, timeout=120, limits=limits) as client:
        calls = [asyncio.create_task(one(client)) for _ in range(n)]
        if release_at is not None:
            for _ in range(6000):
                if sim.stats()[model]["waiting"] == n:
                    break
                await asyncio.sleep(0.01)
            sim.configure(model, capacity=release_at)
        return list(await asyncio.gather(*calls))


def per_token_ms(max_num_seqs: int, batch: int, tokens: int = 64, prompt_words: int = 1) -> float:
    """Mean inter-token time of ``batch`` streams let in together at ``max_num_seqs``."""
    model = SimModel(name="m", capacity=0, tokens=tokens, kv_blocks=8192)
    with Simulator([model]) as sim:
        asyncio.run(streams(sim, model.name, batch, tokens, prompt_words, release_at=max_num_seqs))
        metrics = httpx.get(sim.url + "/metrics").text
    mean = histogram_mean(metrics, "vllm:inter_token_latency_seconds") or histogram_mean(
        metrics, "vllm:time_per_output_token_seconds")
    return mean * 1000


def fixed_mode_latencies() -> dict[int, float]:
    out = {}
    for n in (1, 16, 17):
        with Simulator([SimModel(name="m", capacity=16, service_ms=200.0)]) as sim:
            out[n] = max(asyncio.run(streams(sim, "m", n, 16))) * 1000
    return out


def admission() -> dict[str, int]:
    out = {}
    with Simulator([SimModel(name="m", capacity=8, max_num_queued_tokens=500, tokens=400)]) as sim:
        chat = sim.base_url + "/chat/completions"
        out["idle engine, 600-token prompt, limit 500"] = httpx.post(
            chat, json={"model": "m", "messages": [{"role": "user", "content": "w " * 600}], "max_tokens": 1},
            timeout=60).status_code

        async def two_decoding_then_third() -> int:
            body = {"model": "m", "messages": [{"role": "user", "content": "w " * 300}], "stream": True}
            async with httpx.AsyncClient(base_url=sim.base_url, timeout=60) as client:
                async with client.stream("POST", "/chat/completions", json=body) as a, \
                        client.stream("POST", "/chat/completions", json=body) as b:
                    for stream in (a, b):  # both past their first token: decoding
                        async for line in stream.aiter_lines():
                            if '"content":"' in line and '"content":""' not in line:
                                break
                    third = await client.post("/chat/completions", json={**body, "stream": False, "max_tokens": 1})
                    return third.status_code

        out["third request while two 300-token prompts decode, limit 500"] = asyncio.run(two_decoding_then_third())
    return out


def dead_engine() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with Simulator([SimModel(name="m", capacity=2)], port=port) as sim:
        sim.configure("m", down=True)
        time.sleep(7)
        try:
            return f"HTTP {httpx.post(sim.base_url + '/chat/completions', json={'model': 'm', 'messages': []}, timeout=5).status_code}"
        except httpx.ConnectError:
            return "connection refused"


def engine_figures() -> None:
    print("on the engine's own clock (EngineCore, no HTTP): mean inter-token ms / slowest answer ms")
    for limit in (8, 64):
        itl, _ = engine_run(SimModel(name="m", capacity=limit, tokens=64), 8, 64)
        print(f"  batch 8 at max_num_seqs {limit:>3}: {itl:7.2f}")
    for batch in (1, 16, 64, 256):
        itl, e2e = engine_run(SimModel(name="m", capacity=256, tokens=64, kv_blocks=8192), batch, 64)
        print(f"  batch {batch:>3} at max_num_seqs 256, 64 tokens: {itl:7.2f} / {e2e:8.1f}")
    for batch in (1, 16):
        itl, e2e = engine_run(SimModel(name="m", capacity=256, tokens=64, kv_blocks=8192), batch, 64, prompt=2000)
        print(f"  batch {batch:>3} at max_num_seqs 256, 2,000-token prompts: {itl:7.2f} / {e2e:8.1f}")
    for n in (1, 16, 17):
        _, e2e = engine_run(SimModel(name="m", capacity=16, service_ms=200.0, tokens=16), n, 16)
        print(f"  fixed mode (service_ms 200, max_num_seqs 16), {n:>2} at once: slowest {e2e:7.1f}")
    for n in (1, 16, 17):
        _, e2e = engine_run(SimModel(name="m", capacity=16, tokens=32), n, 32)
        print(f"  step law (max_num_seqs 16, 32 tokens), {n:>2} at once: slowest {e2e:7.1f}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench_sim.py")
    parser.add_argument("--smoke", action="store_true", help="the per-token figures only")
    args = parser.parse_args(argv)
    engine_figures()
    print("over HTTP: per-token time (ms), from vllm:inter_token_latency_seconds, 64-token answers, 1-word prompts")
    for limit in (8, 64):
        print(f"  batch 8 at max_num_seqs {limit:>3}: {per_token_ms(limit, 8):7.2f}")
    if args.smoke:
        return 0
    for batch in (1, 16, 64):
        print(f"  batch {batch:>2} at max_num_seqs 256: {per_token_ms(256, batch):7.2f}")
    print(f"  batch 16, 2,000-word prompts, max_num_seqs 256: {per_token_ms(256, 16, prompt_words=2000):7.2f}")
    print("over HTTP, fixed mode (service_ms 200, capacity 16): slowest answer (ms, this machine's wall clock)")
    for n, ms in fixed_mode_latencies().items():
        print(f"  {n:>2} at once: {ms:7.1f}")
    print("admission (status codes)")
    for label, status in admission().items():
        print(f"  {label}: {status}")
    print(f"dead engine, a request 7 s after it died: {dead_engine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

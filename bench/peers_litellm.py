"""The LiteLLM arm: its Router, configured as its documentation recommends for
this job, in 1..N processes (as a deployment runs it: one Router per replica).

Per deployment ``max_parallel_requests`` at the pool's width, Redis for the
state the routers share (usage, cooldowns), per-request ``priority`` (its
scheduler), ``fallbacks`` from the primary to the fallback model, and a
``retry_policy`` per error class. Each process gets every N-th request of a
scenario (a load balancer's round robin) and sends it at its moment.

LiteLLM is an optional extra (``pip install -e '.[peers]'``); nothing in
``lanes`` imports it. It is imported only in the child processes.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time

from peers_workload import CHAT, MODELS, WIDTH, Outcome, Request

PRIORITY = {"interactive": 0, "background": 2}  # LiteLLM: 0 is the highest


def available() -> str | None:
    """LiteLLM's version, or None when the peers extra is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("litellm")
    except PackageNotFoundError:
        return None


def router_arguments(sim_base_url: str, redis_url: str) -> dict:
    from litellm.types.router import RetryPolicy

    deployments = [
        {"model_name": name,
         "litellm_params": {"model": f"openai/{name}", "api_base": sim_base_url, "api_key": "unused",
                            "max_parallel_requests": WIDTH}}
        for name in MODELS
    ]
    return {
        "model_list": deployments,
        "redis_url": redis_url,
        "fallbacks": [{"primary": ["fallback"]}],
        "num_retries": 2,
        "retry_policy": RetryPolicy(RateLimitErrorRetries=3, InternalServerErrorRetries=1, TimeoutErrorRetries=1,
                                    BadRequestErrorRetries=0, AuthenticationErrorRetries=0),
        "allowed_fails": 3,
        "cooldown_time": 5,
        "timeout": 120,
    }


def failure_reason(error: BaseException) -> str:
    """A short label per kind of failure (the table counts them)."""
    text = str(error)
    name = type(error).__name__
    if name == "RateLimitError":
        return "429 max_parallel_requests (router)" if "max_parallel_requests" in text else "429 backend"
    if name == "Timeout" or isinstance(error, asyncio.TimeoutError):
        return "timeout"
    status = getattr(error, "status_code", None)
    return f"{status} {name}" if status else name


async def _one(router, request: Request, start_at: float) -> Outcome:
    # Times count from the request's moment, as in the other arms (peers_celery.run_on_schedule).
    sent = start_at + request.at
    await asyncio.sleep(max(0.0, sent - time.time()))
    left = sent + request.deadline - time.time()
    if left <= 0:
        return Outcome(request.index, request.kind, sent, time.time(), False, "expired before sent")
    try:
        await router.acompletion(model="primary", messages=CHAT["messages"], max_tokens=CHAT["max_tokens"],
                                 priority=PRIORITY[request.kind], timeout=left)
        return Outcome(request.index, request.kind, sent, time.time(), True)
    except Exception as error:  # every failure is a figure: counted by reason
        return Outcome(request.index, request.kind, sent, time.time(), False, failure_reason(error))


async def _scenario(router, requests: list[Request], start_at: float) -> list[Outcome]:
    return list(await asyncio.gather(*(_one(router, r, start_at) for r in requests)))


def _router_process(conn, sim_base_url: str, redis_url: str) -> None:
    # The bundled model price map, not a download (only loopback traffic here).
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    import litellm
    from litellm import Router

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    loop = asyncio.new_event_loop()  # one loop for the process: the Router caches clients per loop
    router = Router(**router_arguments(sim_base_url, redis_url))
    conn.send("ready")
    while (job := conn.recv()) is not None:
        requests, start_at = job
        cpu = time.process_time()
        outcomes = loop.run_until_complete(_scenario(router, requests, start_at))
        conn.send(([o.as_dict() for o in outcomes], time.process_time() - cpu))
    loop.close()


class LiteLLMArm:
    def __init__(self, processes: int, sim_base_url: str, redis_url: str) -> None:
        self.name = f"litellm_{processes}p"
        context = multiprocessing.get_context("spawn")
        self._conns, self._procs = [], []
        for _ in range(processes):
            parent, child = context.Pipe()
            proc = context.Process(target=_router_process, args=(child, sim_base_url, redis_url), daemon=True)
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)
        for conn, proc in zip(self._conns, self._procs):
            if not conn.poll(180) or conn.recv() != "ready":
                self.close()
                raise RuntimeError(f"a LiteLLM router process did not start (exit code {proc.exitcode})")

    def run(self, requests: list[Request], start_at: float) -> tuple[list[Outcome], float]:
        """Every request sent at its moment; the outcomes and the routers' CPU seconds."""
        count = len(self._conns)
        for k, conn in enumerate(self._conns):
            conn.send(([r for r in requests if r.index % count == k], start_at))
        outcomes, cpu = [], 0.0
        for conn in self._conns:
            if not conn.poll(600):
                raise RuntimeError("a LiteLLM router process did not finish its share within 600 s")
            found, seconds = conn.recv()
            outcomes += [Outcome(**o) for o in found]
            cpu += seconds
        return outcomes, cpu

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc in self._procs:
            # Its figures are in; LiteLLM's exit handlers take seconds more: end it after a short wait.
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
                proc.join(10)

"""The simulator's HTTP surface, as a plain ASGI app (one per listening port).

Plain ASGI rather than a framework's routes because the chat handler must own
the exact order of its sends: it counts a request out *before* the last byte
of the answer leaves (see ``engine``), and it watches for the client going
away while it waits or streams, as vLLM's ``with_cancellation`` does, so a
client that disconnects frees its slot at once.

Routes (``/v1`` and ``/metrics`` see the models of this port; ``/admin`` sees
every model of the simulator from any port):

- ``POST /v1/chat/completions``, ``POST /v1/embeddings``, ``GET /v1/models``
- ``GET /metrics`` (``?model=NAME`` for one model), ``GET /health``
- ``GET /admin/stats``, ``POST /admin/models/{name}`` (JSON changes),
  ``POST /admin/reset`` (``{"config": true}`` also restores the start settings)
- ``GET /admin/calls``: every inference request as it arrived, with the task
  id a Lanes worker sends in ``X-Lanes-Task`` (fault tests count calls per task)
"""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs

from lanes.errors import InvalidInput
from lanes.sim import openai
from lanes.sim.engine import ModelEngine, Rejected, Ticket
from lanes.sim.fleet import TASK_HEADER, Fleet
from lanes.sim.metrics import CONTENT_TYPE, exposition
from lanes.sim.model import Timing

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class ClientGone(Exception):
    """The client left before its request body arrived."""


class BadRequest(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


async def send_bytes(send, status: int, body: bytes, headers: list) -> None:
    # A length (not chunked encoding) lets the answer leave in one write.
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(send, status: int, obj: Any) -> None:
    await send_bytes(send, status, openai.dumps(obj), JSON_HEADERS)


async def read_body(receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def parse_json(body: bytes, *, required: bool = True) -> dict[str, Any]:
    if not body.strip():
        if required:
            raise BadRequest(400, "a JSON object body is required")
        return {}
    try:
        value = json.loads(body)
    except ValueError as exc:
        raise BadRequest(400, f"body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest(400, f"body must be a JSON object, not {type(value).__name__}")
    return value


@asynccontextmanager
async def cancel_on_disconnect(receive):
    """Cancel the enclosed work when the client disconnects; swallow that cancel.

    Needs the request body to be read already. After the response is
    complete the server also reports a disconnect, but by then the block has
    no await left, so the watcher never gets to run.
    """
    task = asyncio.current_task()
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    watcher = asyncio.create_task(watch())
    try:
        yield
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()
    finally:
        watcher.cancel()


async def sleep_until(loop: asyncio.AbstractEventLoop, deadline: float) -> None:
    # Absolute deadlines: per-token sleeps never add up their overshoots.
    delay = deadline - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)


def _task_of(scope) -> str | None:
    for name, value in scope.get("headers") or ():
        if name == TASK_HEADER:
            return value.decode("latin-1")
    return None


class SimApp:
    def __init__(self, fleet: Fleet, port: int | None) -> None:
        self.fleet = fleet
        self.port = port  # None: the main port
        self.tasks: set[asyncio.Task] = set()  # requests being handled
        self.stopping = False

    def models(self) -> dict[str, ModelEngine]:
        return self.fleet.on_port(self.port)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        task = asyncio.current_task()
        self.tasks.add(task)
        sent = {"started": False, "complete": False}

        async def tracked_send(message) -> None:
            if message["type"] == "http.response.start":
                sent["started"] = True
            elif not message.get("more_body"):
                sent["complete"] = True
            await send(message)

        try:
            await self.route(scope, receive, tracked_send)
        except asyncio.CancelledError:
            if not self.stopping:
                raise
            # Stopped by the simulator: end the answer cleanly, no error log.
            if not sent["started"]:
                await send_json(send, 503, openai.error(503, "the simulator is stopping", "ServiceUnavailableError"))
            elif not sent["complete"]:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.tasks.discard(task)

    async def drain(self, grace_s: float) -> None:
        """Let running requests finish for ``grace_s``, then cancel the rest."""
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=grace_s)
        self.stopping = True
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=1.0)

    async def route(self, scope, receive, send) -> None:
        method, path = scope["method"], scope["path"].rstrip("/") or "/"
        try:
            if method == "POST" and path == "/v1/chat/completions":
                body = parse_json(await read_body(receive))
                self.fleet.record_call(body.get("model"), _task_of(scope))
                await self.chat(receive, send, body)
            elif method == "POST" and path == "/v1/embeddings":
                body = parse_json(await read_body(receive))
                self.fleet.record_call(body.get("model"), _task_of(scope))
                await self.embeddings(receive, send, body)
            elif method == "GET" and path == "/v1/models":
                await send_json(send, 200, openai.models_list(sorted(self.models())))
            elif method == "GET" and path == "/metrics":
                await self.metrics(scope, send)
            elif method == "GET" and path == "/health":
                await send_bytes(send, 200, b"", [])
            elif path.startswith("/admin/"):
                await self.admin(method, path, receive, send)
            else:
                raise BadRequest(404, f"no route {method} {path}", "NotFoundError")
        except BadRequest as exc:
            await send_json(send, exc.status, openai.error(exc.status, str(exc), exc.kind))
        except ClientGone:
            pass  # nobody is left to answer

    def engine_for(self, body: dict[str, Any], kind: str) -> ModelEngine:
        name = body.get("model")
        if not isinstance(name, str):
            raise BadRequest(400, "field 'model' is required and must be a string")
        engine = self.models().get(name)
        if engine is None:
            served = ", ".join(sorted(self.models())) or "none"
            raise BadRequest(404, f"The model `{name}` does not exist (served here: {served}).", "NotFoundError")
        if engine.model.kind != kind:
            raise BadRequest(400, f"model {name!r} is a {engine.model.kind} model, not {kind}")
        return engine

    # --- chat ------------------------------------------------------------------

    async def chat(self, receive, send, body: dict[str, Any]) -> None:
        engine = self.engine_for(body, "chat")
        stream = bool(body.get("stream"))
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        max_tokens = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else None
        options = body.get("stream_options") or {}
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        prompt = openai.prompt_tokens(body.get("messages"))

        ticket = engine.arrive()
        try:
            async with cancel_on_disconnect(receive):
                if not await self.admit(engine, ticket, send, headers=SSE_HEADERS if stream else None):
                    return
                timing = engine.sample(max_tokens)
                if stream:
                    await self.stream_tokens(engine, ticket, send, timing, prompt, include_usage)
                else:
                    await self.complete(engine, ticket, send, timing, prompt)
        finally:
            engine.finish(ticket, "cancelled")  # a no-op when already finished

    async def admit(self, engine: ModelEngine, ticket: Ticket, send, headers: list | None) -> bool:
        """Failure injection, deferral, capacity; False when already answered.

        ``headers``: a stream's response starts once it is accepted (queued or
        running), as vLLM's does; a rejection is decided before that.
        """
        try:
            failure = engine.injected_failure()
            if failure is not None:
                engine.finish(ticket, "failed")
                raise failure
            await engine.defer(ticket)
            try:
                engine.enter(ticket)
            except Rejected:
                engine.finish(ticket, "rejected")
                raise
        except Rejected as exc:
            await send_json(send, exc.status, openai.error(exc.status, str(exc), exc.kind))
            return False
        if headers is not None:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
        await engine.wait_turn(ticket)
        hang = engine.take_hang()
        if hang is not None:
            await asyncio.sleep(hang)  # holds its slot, as a stuck engine would
        return True

    async def complete(self, engine: ModelEngine, ticket: Ticket, send, timing: Timing, prompt: int) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await sleep_until(loop, start + timing.ttft_s)
        engine.first_token(ticket)
        await sleep_until(loop, start + timing.total_s)
        body = openai.dumps(openai.completion(engine.model.name, timing.tokens, prompt))
        engine.finish(ticket, "served")
        await send_bytes(send, 200, body, JSON_HEADERS)

    async def stream_tokens(self, engine, ticket, send, timing: Timing, prompt: int, include_usage: bool) -> None:
        loop = asyncio.get_running_loop()
        writer = openai.ChunkWriter(engine.model.name)
        start = loop.time()
        i = 0
        while i < timing.tokens:
            await sleep_until(loop, start + timing.ttft_s + timing.per_token_s * i)
            if i == 0:
                engine.first_token(ticket)
            # Every token already due goes out in one write.
            parts = []
            now = loop.time()
            while i < timing.tokens and start + timing.ttft_s + timing.per_token_s * i <= now + 1e-4:
                delta = {"role": "assistant", "content": openai.token(i)} if i == 0 else {"content": openai.token(i)}
                last = i == timing.tokens - 1
                parts.append(writer.chunk(delta, "length" if last else None))
                i += 1
            if i == timing.tokens:
                if include_usage:
                    parts.append(writer.usage_chunk(prompt, timing.tokens))
                parts.append(writer.DONE)
                engine.finish(ticket, "served")  # before the client can see the end
            await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # --- embeddings ----------------------------------------------------------------

    async def embeddings(self, receive, send, body: dict[str, Any]) -> None:
        engine = self.engine_for(body, "embedding")
        texts = openai.embedding_inputs(body.get("input"))
        if texts is None:
            raise BadRequest(400, "field 'input' must be a string or a non-empty list of strings or token lists")
        ticket = engine.arrive()
        try:
            async with cancel_on_disconnect(receive):
                if not await self.admit(engine, ticket, send, headers=None):
                    return
                await asyncio.sleep(engine.model.embedding_ms / 1000)
                engine.first_token(ticket)
                answer = openai.dumps(openai.embeddings(engine.model.name, texts, engine.model.embedding_dim))
                engine.finish(ticket, "served")
                await send_bytes(send, 200, answer, JSON_HEADERS)
        finally:
            engine.finish(ticket, "cancelled")

    # --- metrics and admin -------------------------------------------------------

    async def metrics(self, scope, send) -> None:
        query = parse_qs(scope.get("query_string", b"").decode())
        engines = self.models()
        if "model" in query:
            wanted = query["model"]
            unknown = [n for n in wanted if n not in engines]
            if unknown:
                raise BadRequest(404, f"unknown model {unknown[0]!r} (served here: {', '.join(sorted(engines))})", "NotFoundError")
            engines = {n: engines[n] for n in wanted}
        await send_bytes(send, 200, exposition(engines.values()), [(b"content-type", CONTENT_TYPE.encode())])

    async def admin(self, method: str, path: str, receive, send) -> None:
        try:
            if method == "GET" and path == "/admin/stats":
                await send_json(send, 200, self.fleet.stats())
            elif method == "GET" and path == "/admin/calls":
                await send_json(send, 200, [{"model": m, "task_id": t} for m, t in self.fleet.calls])
            elif method == "POST" and path == "/admin/reset":
                options = parse_json(await read_body(receive), required=False)
                self.fleet.reset(config=bool(options.get("config")))
                await send_json(send, 200, self.fleet.stats())
            elif path.startswith("/admin/models/") and method in ("GET", "POST"):
                name = path.removeprefix("/admin/models/")
                if name not in self.fleet.engines:
                    raise BadRequest(404, f"unknown model {name!r} (known: {', '.join(sorted(self.fleet.engines))})", "NotFoundError")
                if method == "POST":
                    await send_json(send, 200, self.fleet.configure(name, parse_json(await read_body(receive))))
                else:
                    await send_json(send, 200, self.fleet.engines[name].stats())
            else:
                raise BadRequest(404, f"no route {method} {path}", "NotFoundError")
        except InvalidInput as exc:
            raise BadRequest(400, str(exc)) from None
        except TypeError as exc:  # a dataclasses.replace() with a bad value type
            raise BadRequest(400, str(exc)) from None

"""The simulator's HTTP surface, as a plain ASGI app (one per listening port).

Plain ASGI rather than a framework's routes because the chat handler must own
the exact order of its sends: it counts a request out *before* the last byte
of the answer leaves (see ``served``), and it watches for the client going
away while it waits or streams, as vLLM's ``with_cancellation`` does, so a
client that disconnects frees its slot at once.

Routes (``/v1`` and ``/metrics`` see the models of this port; ``/admin`` sees
every model of the simulator from any port):

- ``POST /v1/chat/completions``, ``POST /v1/embeddings``, ``GET /v1/models``
- ``GET /metrics`` (every model of the port; gauges lag, see ``metrics``),
  ``GET /health`` (503 while a model of the port is down)
- ``GET /farm/services``: each model's capacity as a farm service limit
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

from lanes.errors import InvalidInput
from lanes.sim import openai
from lanes.sim.engine import FINISHED, SimRequest
from lanes.sim.fleet import TASK_HEADER, Call, Fleet
from lanes.sim.metrics import CONTENT_TYPE, Scrape, exposition
from lanes.sim.served import Rejected, ServedModel, Ticket

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


async def changed(request: SimRequest) -> None:
    """Wait until the engine changes ``request`` (a token, its end, a failure)."""
    await request.listener.wait()
    request.listener.clear()


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

    def models(self) -> dict[str, ServedModel]:
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
                call = self.fleet.record_call(body.get("model"), _task_of(scope))
                await self.chat(receive, send, body, call)
            elif method == "POST" and path == "/v1/embeddings":
                body = parse_json(await read_body(receive))
                call = self.fleet.record_call(body.get("model"), _task_of(scope))
                await self.embeddings(receive, send, body, call)
            elif method == "GET" and path == "/v1/models":
                await send_json(send, 200, openai.models_list(sorted(self.models())))
            elif method == "GET" and path == "/metrics":
                await self.metrics(send)
            elif method == "GET" and path == "/health":
                await self.health(send)
            elif method == "GET" and path == "/farm/services":
                # A farm's per-service limits for `lanes check` (each simulated model is one service).
                limits = {name: engine.model.capacity for name, engine in self.fleet.engines.items()}
                await send_json(send, 200, {"services": limits})
            elif path.startswith("/admin/"):
                await self.admin(method, path, receive, send)
            else:
                raise BadRequest(404, f"no route {method} {path}", "NotFoundError")
        except BadRequest as exc:
            await send_json(send, exc.status, openai.error(exc.status, str(exc), exc.kind))
        except ClientGone:
            pass  # nobody is left to answer

    def engine_for(self, body: dict[str, Any], kind: str) -> ServedModel:
        name = body.get("model")
        if not isinstance(name, str):
            raise BadRequest(400, "field 'model' is required and must be a string")
        served = self.models().get(name)
        if served is None:
            names = ", ".join(sorted(self.models())) or "none"
            raise BadRequest(404, f"The model `{name}` does not exist (served here: {names}).", "NotFoundError")
        if served.model.kind != kind:
            raise BadRequest(400, f"model {name!r} is a {served.model.kind} model, not {kind}")
        return served

    # --- chat ------------------------------------------------------------------

    async def chat(self, receive, send, body: dict[str, Any], call: Call | None = None) -> None:
        served = self.engine_for(body, "chat")
        stream = bool(body.get("stream"))
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        max_tokens = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else None
        options = body.get("stream_options") or {}
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        prompt = openai.prompt_tokens(body.get("messages"))
        script = openai.scripted_answer(body.get("messages"))

        ticket = served.arrive()
        if call is not None:
            call.ticket = ticket
        try:
            async with cancel_on_disconnect(receive):
                request = await self.admit(served, ticket, send, prompt, max_tokens, SSE_HEADERS if stream else None)
                if request is None:
                    return
                if stream:
                    await self.stream_tokens(served, ticket, request, send, prompt, include_usage, script)
                else:
                    await self.complete(served, ticket, request, send, prompt, script)
        finally:
            served.finish(ticket, "cancelled")  # a no-op when already finished

    async def admit(self, served: ServedModel, ticket: Ticket, send, prompt: int, max_tokens: int | None,
                    headers: list | None) -> SimRequest | None:
        """Failure injection, tokenizing, the engine's admission; None when already answered.

        ``headers``: a stream's response starts once the engine accepted it
        (queued or running), as vLLM's does; a refusal is decided before that.
        """
        try:
            failure = served.injected_failure()
            if failure is not None:
                served.finish(ticket, "failed")
                raise failure
            if served.model.tokenize_ms > 0:  # in flight, but in no engine gauge yet
                await asyncio.sleep(served.model.tokenize_ms / 1000)
            try:
                request = served.submit(ticket, prompt_tokens=prompt, max_tokens=max_tokens)
            except Rejected:
                served.finish(ticket, "rejected")
                raise
        except Rejected as exc:
            await send_json(send, exc.status, openai.error(exc.status, str(exc), exc.kind))
            return None
        if headers is not None:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
        return request

    async def complete(self, served: ServedModel, ticket: Ticket, request: SimRequest, send, prompt: int,
                       script: str | None = None) -> None:
        while not request.done:
            await changed(request)
        if request.state != FINISHED:
            served.finish(ticket, "failed")
            await send_json(send, 500, openai.error(500, request.error or "request failed", "InternalServerError"))
            return
        answer = openai.completion(served.model.name, request.generated, prompt, request.finish_reason, script)
        served.finish(ticket, "served")
        await send_bytes(send, 200, openai.dumps(answer), JSON_HEADERS)

    async def stream_tokens(self, served, ticket, request: SimRequest, send, prompt: int, include_usage: bool,
                            script: str | None = None) -> None:
        """A role chunk first, a chunk per token as the engine makes them, and
        the end: ``[DONE]``, or an error frame then ``[DONE]`` (still HTTP 200)
        when the request fails mid-way. A preempted request simply stalls."""
        writer = openai.ChunkWriter(served.model.name)
        sent = 0
        while True:
            parts = []
            if sent == 0 and request.generated > 0:
                parts.append(writer.chunk({"role": "assistant", "content": ""}))
            while sent < request.generated:
                last = request.state == FINISHED and sent == request.generated - 1
                parts.append(writer.chunk({"content": openai.text_token(script, sent, request.max_tokens)}, request.finish_reason if last else None))
                sent += 1
            if request.done:
                if request.state == FINISHED:
                    if include_usage:
                        parts.append(writer.usage_chunk(prompt, request.generated))
                    served.finish(ticket, "served")  # before the client can see the end
                else:
                    parts.append(writer.error_chunk(openai.error(500, request.error or "request failed", "InternalServerError")))
                    served.finish(ticket, "failed")
                parts.append(writer.DONE)
            if parts:
                await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
            if request.done:
                break
            await changed(request)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # --- embeddings ----------------------------------------------------------------

    async def embeddings(self, receive, send, body: dict[str, Any], call: Call | None = None) -> None:
        served = self.engine_for(body, "embedding")
        texts = openai.embedding_inputs(body.get("input"))
        if texts is None:
            raise BadRequest(400, "field 'input' must be a string or a non-empty list of strings or token lists")
        ticket = served.arrive()
        if call is not None:
            call.ticket = ticket
        try:
            async with cancel_on_disconnect(receive):
                prompt = sum(len(t.split()) for t in texts)
                request = await self.admit(served, ticket, send, prompt, None, headers=None)
                if request is None:
                    return
                while not request.done:
                    await changed(request)
                if request.state != FINISHED:
                    served.finish(ticket, "failed")
                    await send_json(send, 500, openai.error(500, request.error or "request failed", "InternalServerError"))
                    return
                answer = openai.dumps(openai.embeddings(served.model.name, texts, served.model.embedding_dim))
                served.finish(ticket, "served")
                await send_bytes(send, 200, answer, JSON_HEADERS)
        finally:
            served.finish(ticket, "cancelled")

    # --- metrics, health and admin -------------------------------------------------------

    async def metrics(self, send) -> None:
        """Every model of this port. A model with replicas behind a load
        balancer answers from one replica chosen at random, as a scrape
        through the balancer would; a data-parallel one from every rank."""
        scrape = Scrape()
        for name, served in sorted(self.models().items()):
            cores = served.cores
            if served.model.data_parallel:
                engines = [(str(i), core) for i, core in enumerate(cores)]
            else:
                engines = [("0", cores[served.scrape_rng.randrange(len(cores))])]
            scrape.add(name, served.model.metrics_flavor, engines, served.rejections)
        body = exposition(scrape, asyncio.get_running_loop().time())
        await send_bytes(send, 200, body, [(b"content-type", CONTENT_TYPE.encode())])

    async def health(self, send) -> None:
        dead = sorted(name for name, served in self.models().items() if served.model.down)
        if dead:
            await send_json(send, 503, openai.error(503, f"engine dead: {', '.join(dead)}", "ServiceUnavailableError"))
        else:
            await send_bytes(send, 200, b"", [])

    async def admin(self, method: str, path: str, receive, send) -> None:
        try:
            if method == "GET" and path == "/admin/stats":
                await send_json(send, 200, self.fleet.stats())
            elif method == "GET" and path == "/admin/calls":
                await send_json(send, 200, self.fleet.call_records())
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

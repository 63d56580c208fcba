"""The simulator's HTTP surface, as a plain ASGI app (one per listening port).

Plain ASGI rather than a framework's routes because the chat handler must own
the exact order of its sends: it counts a request out *before* the last byte
of the answer leaves (see ``served``), and it watches for the client going
away while it waits or streams, as vLLM's ``with_cancellation`` does, so a
client that disconnects frees its slot at once.

Routes (``/v1`` and ``/metrics`` see the models of this port; ``/admin`` sees
every model of the simulator from any port):

- ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/embeddings``,
  ``GET /v1/models`` (with each model's ``max_model_len``); a request vLLM
  would refuse (no messages, ``max_tokens`` 0, ``n`` 0...) is answered 400
  in vLLM's error shape
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
from typing import Any, Callable

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
async def cancel_on_disconnect(receive, on_gone: Callable[[], None] | None = None):
    """Cancel the enclosed work when the client disconnects; swallow that cancel.

    ``on_gone`` runs as soon as the disconnect is read, before the cancel
    reaches the work (a loop turn later): the request is counted out at the
    moment the server knows its client left, so a request sent after the
    client saw the server close that connection always finds it counted out.

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
        if on_gone is not None:
            on_gone()
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
            if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
                body = parse_json(await read_body(receive))
                call = self.fleet.record_call(body.get("model"), _task_of(scope))
                await self.generate(receive, send, body, call, chat=path.endswith("/chat/completions"))
            elif method == "POST" and path == "/v1/embeddings":
                body = parse_json(await read_body(receive))
                call = self.fleet.record_call(body.get("model"), _task_of(scope))
                await self.embeddings(receive, send, body, call)
            elif method == "GET" and path == "/v1/models":
                limits = {name: served.model.context_limit for name, served in self.models().items()}
                await send_json(send, 200, openai.models_list(limits))
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

    # --- generation (chat and completions) ----------------------------------------

    async def generate(self, receive, send, body: dict[str, Any], call: Call | None = None, *, chat: bool) -> None:
        served = self.engine_for(body, "chat")
        try:
            params = openai.chat_params(body) if chat else openai.completion_params(body)
        except openai.Invalid as exc:
            raise BadRequest(400, str(exc)) from None
        ticket = served.arrive()
        if call is not None:
            call.ticket = ticket
        try:
            async with cancel_on_disconnect(receive, lambda: served.finish(ticket, "cancelled")):
                requests = await self.admit(served, ticket, send, params, SSE_HEADERS if params.stream else None)
                if requests is None:
                    return
                if params.stream:
                    writer = openai.ChunkWriter(served.model.name) if chat else openai.TextChunkWriter(served.model.name)
                    await self.stream_tokens(served, ticket, requests, send, params, writer)
                else:
                    await self.complete(served, ticket, requests, send, params, chat)
        finally:
            served.finish(ticket, "cancelled")  # a no-op when already finished

    async def admit(self, served: ServedModel, ticket: Ticket, send, params: openai.Params,
                    headers: list | None) -> list[SimRequest] | None:
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
                requests = served.submit(ticket, prompt_tokens=params.prompt_tokens, max_tokens=params.max_tokens,
                                         n=params.n)
            except Rejected:
                served.finish(ticket, "rejected")
                raise
        except Rejected as exc:
            if exc.raw is not None:
                body, content_type = exc.raw
                await send_bytes(send, exc.status, body, [(b"content-type", content_type)])
            else:
                await send_json(send, exc.status, openai.error(exc.status, str(exc), exc.kind))
            if exc.dead_engine is not None:
                # vLLM's EngineDeadError handler: answer, then the server exits.
                asyncio.get_running_loop().call_soon(served.death.exit_server, exc.dead_engine)
            return None
        if headers is not None:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
        return requests

    async def complete(self, served: ServedModel, ticket: Ticket, requests: list[SimRequest], send,
                       params: openai.Params, chat: bool) -> None:
        while not all(r.done for r in requests):
            await changed(requests[0])
        failed = next((r for r in requests if r.state != FINISHED), None)
        if failed is not None:
            served.finish(ticket, "failed")
            await send_json(send, 500, openai.error(500, failed.error or "request failed", "InternalServerError"))
            return
        answers = [(r.generated, r.finish_reason) for r in requests]
        if chat:
            answer = openai.completion(served.model.name, answers, params.prompt_tokens, params.script)
        else:
            answer = openai.text_completion(served.model.name, answers, params.prompt_tokens)
        served.finish(ticket, "served")
        await send_bytes(send, 200, openai.dumps(answer), JSON_HEADERS)

    async def stream_tokens(self, served, ticket, requests: list[SimRequest], send, params: openai.Params,
                            writer: openai.ChunkWriter) -> None:
        """Per sequence, a role chunk first (chat), then a chunk per token as the
        engine makes them (choice ``index`` = the sequence), and the end:
        ``[DONE]``, or an error frame then ``[DONE]`` (still HTTP 200) when a
        sequence fails mid-way. A preempted sequence simply stalls."""
        sent = [0] * len(requests)
        while True:
            parts = []
            for index, request in enumerate(requests):
                if sent[index] == 0 and request.generated > 0:
                    parts.append(writer.role(index))
                while sent[index] < request.generated:
                    last = request.state == FINISHED and sent[index] == request.generated - 1
                    text = openai.text_token(params.script, sent[index], request.max_tokens)
                    parts.append(writer.text(text, request.finish_reason if last else None, index))
                    sent[index] += 1
            failed = next((r for r in requests if r.done and r.state != FINISHED), None)
            finished = failed is not None or all(r.done for r in requests)
            if finished:
                if failed is None:
                    if params.include_usage:
                        parts.append(writer.usage_chunk(params.prompt_tokens, sum(r.generated for r in requests)))
                    served.finish(ticket, "served")  # before the client can see the end
                else:
                    parts.append(writer.error_chunk(openai.error(500, failed.error or "request failed",
                                                                 "InternalServerError")))
                    served.finish(ticket, "failed")
                parts.append(writer.DONE)
            if parts:
                await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
            if finished:
                break
            await changed(requests[0])
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
            async with cancel_on_disconnect(receive, lambda: served.finish(ticket, "cancelled")):
                prompt = sum(len(t.split()) for t in texts)
                params = openai.Params(prompt_tokens=prompt, max_tokens=None, n=1, stream=False, include_usage=False)
                requests = await self.admit(served, ticket, send, params, headers=None)
                if requests is None:
                    return
                request = requests[0]
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
        dead = sorted(name for name, served in self.models().items() if served.model.down or served.model.down_replicas)
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

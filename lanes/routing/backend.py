"""Calls to OpenAI-compatible backends over one pooled HTTP client per process.

Chat completions are always streamed from the backend, so the time to first
token is measured; the caller gets the assembled answer. A call made under a
lane's permit stops when the permit does (its lease lost, or its slot asked
back by urgent work): the connection is shut at that moment, so the backend
sees the client leave and frees the slot at once, as vLLM aborts a request
whose client disconnected. A call cut for urgent work steps aside: its
thread, woken by the shut connection, waits until the slot has been handed
over before it unwinds (see :class:`_SteppingStream`).

A call has two limits: ``first_token_timeout`` for the first token of a
stream (or the whole answer of an embedding) and ``timeout`` for the whole
call. A hung backend is given up at the first, so the time kept for the next
candidates is not eaten by it (:class:`BackendTimeout` says which limit fired).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import httpcore
import httpx

from lanes.catalog import ModelInfo
from lanes.errors import BackendError, BackendOverloaded, BackendTimeout, LeaseLost


class Abort(Protocol):
    """What stops a call: a lane's :class:`~lanes.lane.Permit` is one. It may
    also have ``wait_handed_over(timeout)``: a cut call's thread then steps
    aside there before it unwinds (see :class:`_SteppingStream`)."""

    @property
    def stopping(self) -> bool: ...

    def on_stop(self, hook: Callable[[], bool | None]) -> Callable[[], None]: ...


# How long a cut call's thread waits for its slot to be handed over before it
# unwinds anyway: a release's round trip takes about a millisecond.
STEP_ASIDE_SECONDS = 0.05

OVERLOAD_STATUSES = frozenset({429, 503, 529})
TASK_HEADER = "x-lanes-task"


@dataclass
class BackendAnswer:
    model: str
    body: dict
    status: int
    seconds: float
    ttft_seconds: float | None = None
    chunks: int = 0
    extra: dict = field(default_factory=dict)


class BackendClient:
    """One connection pool for every backend this process calls."""

    def __init__(self, *, max_connections: int = 256) -> None:
        transport = httpx.HTTPTransport(
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))
        self.steps_aside = _step_aside(transport)
        self._http = httpx.Client(transport=transport, timeout=httpx.Timeout(60.0))

    def close(self) -> None:
        self._http.close()

    def call(
        self,
        model: ModelInfo,
        payload: dict,
        *,
        timeout: float,
        first_token_timeout: float | None = None,
        abort: Abort | None = None,
        task_id: str | None = None,
    ) -> BackendAnswer:
        """Call ``model`` with ``payload`` within ``timeout`` seconds, its first
        token (or embedding answer) within ``first_token_timeout`` (default: ``timeout``).

        Raises BackendOverloaded (429/503/529), BackendTimeout (a limit fired),
        BackendError (anything else that failed) or LeaseLost (``abort`` stopped
        mid-call). The caller makes sure there is time left: a limit <= 0 is a
        caller's bug, not the backend's.
        """
        first = timeout if first_token_timeout is None else min(first_token_timeout, timeout)
        if first <= 0:
            raise ValueError(f"call limits must be > 0 (timeout {timeout}, first token {first_token_timeout})")
        headers = {"content-type": "application/json"}
        if task_id:
            # Lets a backend's logs (and the simulator's call record) name the task.
            headers[TASK_HEADER] = task_id
        if model.api_key_env:
            key = os.environ.get(model.api_key_env)
            if key:
                headers["authorization"] = f"Bearer {key}"
        # The read limit is the first-token limit: it bounds the wait for the
        # first chunk (and any later silence of the same length).
        limit = httpx.Timeout(timeout, connect=min(first, 5.0), read=first)
        start = time.monotonic()
        progress = _Progress()
        try:
            if model.kind == "embedding":
                return self._embed(model, payload, headers, limit, start)
            return self._chat(model, payload, headers, limit, start, timeout, abort, progress)
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ConnectTimeout):
                raise BackendError(f"{model.name} could not be reached within {min(first, 5.0):.1f}s", model.name) from exc
            if progress.ttft is None:
                raise BackendTimeout(
                    f"{model.name} gave no first token within {first:.1f}s; call abandoned",
                    model.name, phase="first_token", limit_seconds=first,
                ) from exc
            raise BackendTimeout(f"{model.name} went silent mid-answer for {first:.1f}s; call abandoned",
                                 model.name, phase="answer", limit_seconds=first) from exc
        except httpx.HTTPError as exc:
            raise BackendError(f"{model.name} could not be reached: {exc}", model.name) from exc

    def _embed(self, model, payload, headers, limit, start) -> BackendAnswer:
        body = {**payload, "model": model.name}
        response = self._http.post(_url(model, "/embeddings"), json=body, headers=headers, timeout=limit)
        _raise_for_status(model, response.status_code, response.text)
        return BackendAnswer(model.name, response.json(), response.status_code, time.monotonic() - start)

    def _chat(self, model, payload, headers, limit, start, timeout, abort, progress) -> BackendAnswer:
        body = {**payload, "model": model.name, "stream": True}
        with self._http.stream(
            "POST", _url(model, "/chat/completions"), json=body, headers=headers, timeout=limit
        ) as response:
            unhook, shuts = _cut_on_stop(abort, response)
            try:
                if response.status_code >= 400:
                    response.read()
                    _raise_for_status(model, response.status_code, response.text)
                # A call whose connection the stop shuts reads on to the end of
                # what had arrived: an answer complete by then is served, not
                # thrown away (the backend did the work; calling it again would
                # do it twice). The shut connection ends the read at once.
                return self._read_stream(model, response, start, timeout, abort, progress, shuts)
            except httpx.HTTPError:
                if abort is not None and abort.stopping:
                    raise _stopped(model) from None
                raise
            finally:
                unhook()

    def _read_stream(self, model, response, start, timeout, abort, progress, shuts: bool) -> BackendAnswer:
        """Assemble a stream's answer. A stop is checked between chunks when
        it cannot shut the connection (``shuts`` False); otherwise the read
        ends where the shut connection did, and only an answer short of
        ``[DONE]`` counts as stopped."""
        content: list[str] = []
        ttft = None
        chunks = 0
        finish_reason = None
        usage = None
        done = False
        for line in response.iter_lines():
            if not shuts and abort is not None and abort.stopping:
                raise _stopped(model)
            if time.monotonic() - start > timeout:
                raise BackendTimeout(f"{model.name} did not finish within {timeout:.1f}s", model.name,
                                     phase="answer", limit_seconds=timeout)
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise _stream_error(model, chunk["error"])
            chunks += 1
            if ttft is None:
                ttft = progress.ttft = time.monotonic() - start
            for choice in chunk.get("choices", []):
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    content.append(delta["content"])
                finish_reason = choice.get("finish_reason") or finish_reason
            usage = chunk.get("usage") or usage
        if not done and abort is not None and abort.stopping:
            raise _stopped(model)
        answer = {
            "model": model.name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(content)},
                    "finish_reason": finish_reason,
                }
            ],
        }
        if usage:
            answer["usage"] = usage
        return BackendAnswer(model.name, answer, 200, time.monotonic() - start, ttft, chunks)


def _stopped(model: ModelInfo) -> LeaseLost:
    return LeaseLost(f"the slot on {model.name}'s lane was lost or asked back mid-call; call aborted")


def _cut_on_stop(abort: Abort | None, response: httpx.Response) -> tuple[Callable[[], None], bool]:
    """Shut the call's connection when ``abort`` stops (from the thread that
    learns it): the reading thread's blocked read returns what had arrived,
    then the end, and the backend sees its client leave. The hook says True
    when it shut it (the call is over for the backend, so the slot may go
    back at once). Returns the function that disarms it, called before the
    connection goes back to the pool, and whether a stop shuts the
    connection (if not, the stop is seen between chunks)."""
    if abort is None:
        return _nothing, False
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is None:
        return _nothing, False
    guard = threading.Lock()
    armed = [True]
    handed_over = getattr(abort, "wait_handed_over", None)

    def cut() -> bool:
        with guard:
            if not armed[0]:
                return False
            if handed_over is not None and isinstance(stream, _SteppingStream):
                stream.after_cut = lambda: handed_over(STEP_ASIDE_SECONDS)  # before the reader can wake
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed: the call is over either way
            return True

    remove = abort.on_stop(cut)

    def disarm() -> None:
        remove()
        with guard:
            armed[0] = False
    return disarm, True


def _nothing() -> None:
    return None


class _SteppingStream(httpcore.NetworkStream):
    """A connection whose reading thread steps aside after its call was cut.

    An urgent request takes a background call's slot by shutting that call's
    connection, then releasing the slot to itself. The shut connection wakes
    the background call's thread at once, and its unwinding (the HTTP
    client's error path, the walk's) would run on the same interpreter while
    the urgent thread waits for the release's reply, and take the
    interpreter from it when the reply comes. So the read that wakes on the
    cut first waits (``after_cut``) until the slot has been handed over.
    """

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner
        self.after_cut: Callable[[], None] | None = None

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            return self._inner.read(max_bytes, timeout)
        finally:
            after = self.after_cut
            if after is not None:
                self.after_cut = None
                after()

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _SteppingStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class _SteppingBackend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return _SteppingStream(self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _SteppingStream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _step_aside(transport: httpx.HTTPTransport) -> bool:
    """Give ``transport``'s connections a :class:`_SteppingStream`. httpx takes
    no network backend of its own, so this sets its pool's; False (calls are
    still cut, without stepping aside) where a later httpcore moved it."""
    pool = getattr(transport, "_pool", None)
    if not isinstance(pool, httpcore.ConnectionPool) or not hasattr(pool, "_network_backend"):
        return False
    pool._network_backend = _SteppingBackend(pool._network_backend)
    return True


class _Progress:
    """How far a streamed call got, for naming the limit that fired."""

    ttft: float | None = None


def _url(model: ModelInfo, path: str) -> str:
    return model.base_url.rstrip("/") + path


def _stream_error(model: ModelInfo, error) -> BackendError:
    """A failure after the stream began: vLLM keeps HTTP 200 and sends
    ``data: {"error": ...}`` then ``[DONE]``. The answer so far is not an
    answer; the call failed as a 5xx would."""
    detail = error.get("message") if isinstance(error, dict) else error
    code = error.get("code") if isinstance(error, dict) else None
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    # An overload status inside a 2xx stream is an overload all the same (the
    # failover share counts it as a breach); other 4xx codes are not kept, so
    # a failure after the stream began is never taken for a refused request.
    if isinstance(code, int) and code in OVERLOAD_STATUSES:
        return BackendOverloaded(f"{model.name} is overloaded mid-stream ({code}): {str(detail)[:200]}",
                                 model.name, code)
    status = code if isinstance(code, int) and 500 <= code <= 599 else None
    return BackendError(f"{model.name} failed mid-stream: {str(detail)[:200]}", model.name, status)


def _raise_for_status(model: ModelInfo, status: int, text: str) -> None:
    if status < 400:
        return
    detail = text.strip().replace("\n", " ")[:200]
    if status in OVERLOAD_STATUSES:
        raise BackendOverloaded(f"{model.name} is overloaded ({status}): {detail}", model.name, status)
    raise BackendError(f"{model.name} answered {status}: {detail}", model.name, status)

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
from lanes.errors import BackendError, BackendOverloaded, BackendTimeout, BackendUnreachable, LeaseLost


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

# How long a cut call's slot waits for the backend to close its end of the
# connection before it goes to the next request (_wait_backend_closed): on
# loopback or in one datacenter a round trip or two, so the bound is rarely met.
BACKEND_CLOSE_SECONDS = 0.25

# How long the end of an answer's body is waited for once ``[DONE]`` came (_finish_body).
FINISH_BODY_SECONDS = 0.02

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


# One connection per pool. httpcore's pool looks at all of its connections
# (a readiness poll of each idle one, and for every idle one a count of all)
# whenever a request starts or ends: one pool of hundreds of kept connections
# cost more than a new connection per call. Pools of one, handed out from a
# free list, keep connections for the next call at the cost of one look.
SHARD_CONNECTIONS = 1


class _Shard:
    """One of the client's connection pools, and how many calls it runs now."""

    def __init__(self, ssl_context) -> None:
        transport = httpx.HTTPTransport(
            verify=ssl_context,
            limits=httpx.Limits(max_connections=SHARD_CONNECTIONS, max_keepalive_connections=SHARD_CONNECTIONS))
        self.steps_aside = _step_aside(transport)
        self.http = httpx.Client(transport=transport, timeout=httpx.Timeout(60.0))
        self.calls = 0


class BackendClient:
    """The connections to every backend this process calls, up to
    ``max_connections`` at once: a call takes the pool last given back (its
    connection the most likely still open), or a new one while fewer than
    that many exist; past the bound, calls queue in the pools in turn."""

    def __init__(self, *, max_connections: int = 256) -> None:
        self.max_connections = max_connections
        self._ssl_context = httpx.create_ssl_context()  # one for all pools (each would load the CA bundle)
        self._lock = threading.Lock()
        self._shards = [_Shard(self._ssl_context)]
        self._free = list(self._shards)
        self._turn = 0
        self.steps_aside = self._shards[0].steps_aside

    def close(self) -> None:
        with self._lock:
            shards = list(self._shards)
        for shard in shards:
            shard.http.close()

    def connections(self) -> list:
        """The connections kept now, over every pool (httpcore's own objects)."""
        with self._lock:
            shards = list(self._shards)
        return [c for shard in shards for c in shard.http._transport._pool.connections]

    def _take(self) -> _Shard:
        with self._lock:
            if self._free:
                shard = self._free.pop()
            elif len(self._shards) * SHARD_CONNECTIONS < self.max_connections:
                shard = _Shard(self._ssl_context)
                self._shards.append(shard)
            else:
                self._turn = (self._turn + 1) % len(self._shards)
                shard = self._shards[self._turn]
            shard.calls += 1
            return shard

    def _give_back(self, shard: _Shard) -> None:
        with self._lock:
            shard.calls -= 1
            if shard.calls == SHARD_CONNECTIONS - 1:
                self._free.append(shard)

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
        shard = self._take()
        try:
            return self._send(shard.http, model, payload, headers, limit, start, timeout, first, abort, progress)
        except BackendError as exc:
            # A failure after the first token: the first token still came when it came.
            exc.ttft_seconds = progress.ttft
            raise
        finally:
            self._give_back(shard)

    def _send(self, http, model, payload, headers, limit, start, timeout, first, abort, progress) -> BackendAnswer:
        try:
            if model.kind == "embedding":
                return self._embed(http, model, payload, headers, limit, start)
            return self._chat(http, model, payload, headers, limit, start, timeout, abort, progress)
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ConnectTimeout):
                raise BackendUnreachable(f"{model.name} could not be reached within {min(first, 5.0):.1f}s",
                                         model.name) from exc
            if progress.ttft is None:
                raise BackendTimeout(
                    f"{model.name} gave no first token within {first:.1f}s; call abandoned",
                    model.name, phase="first_token", limit_seconds=first,
                ) from exc
            raise BackendTimeout(f"{model.name} went silent mid-answer for {first:.1f}s; call abandoned",
                                 model.name, phase="answer", limit_seconds=first) from exc
        except httpx.ConnectError as exc:
            raise BackendUnreachable(f"{model.name} could not be reached: {exc}", model.name) from exc
        except httpx.HTTPError as exc:
            raise BackendError(f"{model.name} could not be reached: {exc}", model.name) from exc

    def _embed(self, http, model, payload, headers, limit, start) -> BackendAnswer:
        body = {**payload, "model": model.name}
        response = http.post(_url(model, "/embeddings"), json=body, headers=headers, timeout=limit)
        _raise_for_status(model, response.status_code, response.text)
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or not isinstance(answer.get("data"), list):
            raise BackendError(f"{model.name} answered {response.status_code} with no embeddings "
                               f"({_excerpt(response.text)}); not an OpenAI embeddings answer", model.name)
        return BackendAnswer(model.name, answer, response.status_code, time.monotonic() - start)

    def _chat(self, http, model, payload, headers, limit, start, timeout, abort, progress) -> BackendAnswer:
        body = {**payload, "model": model.name, "stream": True}
        with http.stream(
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
        lines = response.iter_lines()
        for line in lines:
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
            try:
                chunk = json.loads(data)
            except ValueError:
                chunk = None
            if not isinstance(chunk, dict):
                raise BackendError(f"{model.name} sent a stream frame that is not a JSON object "
                                   f"({_excerpt(data)}); not an OpenAI stream", model.name)
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
        if done:
            _finish_body(response, lines)
        if not done and abort is not None and abort.stopping:
            raise _stopped(model)
        if not done:
            # A 200 that is no stream at all (a proxy's page, garbage), or a stream cut
            # before its end: no answer, whatever arrived.
            raise BackendError(f"{model.name}'s answer ended without data: [DONE] after {chunks} frame(s); "
                               "not a complete OpenAI stream", model.name)
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


def _finish_body(response: httpx.Response, lines) -> None:
    """Read the rest of an answer that ended with ``[DONE]`` (the body's own
    end, normally in the same packet or the next), so its connection goes
    back to the pool: a body left unread closes the connection, and every
    call paid a new connection (a name lookup, a connect, a close), about a
    fifth of a fleet worker's CPU per request (docs/BENCHMARKS_JOURNAL.md,
    "where a request's CPU goes"). The answer is complete already, so a
    backend that keeps the stream open after ``[DONE]`` is waited for at
    most ``FINISH_BODY_SECONDS`` (its connection is then closed, as before),
    and nothing read here changes the answer."""
    stream = response.extensions.get("network_stream")
    if not isinstance(stream, _SteppingStream):
        return
    stream.limit_reads(FINISH_BODY_SECONDS)
    until = time.monotonic() + FINISH_BODY_SECONDS
    try:
        for _ in lines:
            if time.monotonic() > until:
                break
    except (httpx.HTTPError, httpcore.TimeoutException, httpcore.NetworkError, OSError):
        pass
    finally:
        stream.limit_reads(None)


def _excerpt(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return repr(text[:limit] + ("..." if len(text) > limit else "")) if text else "an empty body"


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
                return True  # already closed: the call is over either way
            _wait_backend_closed(sock, BACKEND_CLOSE_SECONDS)
            return True

    remove = abort.on_stop(cut)

    def disarm() -> None:
        remove()
        with guard:
            armed[0] = False
    return disarm, True


# TCP states in which the peer's FIN has arrived after ours (linux/include/net/tcp_states.h).
_PEER_CLOSED = frozenset({6, 7, 11})  # TIME_WAIT, CLOSE, CLOSING


def _wait_backend_closed(sock: socket.socket, seconds: float) -> None:
    """Wait until the backend closed its end of a connection we shut.

    The slot of a cut call goes to the next request right after the cut.
    Without this wait, that request could reach the server before the
    server had read our FIN and let the cut request go, and for a moment
    the backend would hold one request more than the lane's width. A
    server closes its end once it has seen the client leave, which the
    socket's TCP state shows. Linux only (``TCP_INFO``); elsewhere, and
    for a socket already closed, no wait.
    """
    tcp_info = getattr(socket, "TCP_INFO", None)
    if tcp_info is None:
        return
    deadline = time.monotonic() + seconds
    pause = 0.0002
    while True:
        try:
            state = sock.getsockopt(socket.IPPROTO_TCP, tcp_info, 1)[0]
        except OSError:
            return
        if state in _PEER_CLOSED or time.monotonic() >= deadline:
            return
        time.sleep(pause)
        pause = min(2 * pause, 0.005)


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
        # A shorter read limit while a finished answer's body end is read
        # (_finish_body), for that thread's reads only: the end read, the
        # connection is back in the pool, and the next call on it may read
        # before the finishing thread has taken its limit off.
        self._limit: tuple[int, float] | None = None

    def limit_reads(self, seconds: float | None) -> None:
        """Reads of the calling thread wait at most ``seconds`` (None: no more limit)."""
        me = threading.get_ident()
        if seconds is not None:
            self._limit = (me, seconds)
        elif self._limit is not None and self._limit[0] == me:
            self._limit = None

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        limit = self._limit
        if limit is not None and limit[0] == threading.get_ident():
            timeout = limit[1] if timeout is None else min(timeout, limit[1])
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
        error = BackendOverloaded(f"{model.name} is overloaded mid-stream ({code}): {str(detail)[:200]}",
                                  model.name, code)
    else:
        status = code if isinstance(code, int) and 500 <= code <= 599 else None
        error = BackendError(f"{model.name} failed mid-stream: {str(detail)[:200]}", model.name, status)
    # Kept apart from ``status`` for the failover share, which judges every
    # status a workflow lists as an overload (seed 003), 4xx ones included.
    if isinstance(code, int) and 100 <= code <= 599:
        error.stream_status = code
    return error


def _raise_for_status(model: ModelInfo, status: int, text: str) -> None:
    if status < 400:
        return
    detail = text.strip().replace("\n", " ")[:200]
    if status in OVERLOAD_STATUSES:
        raise BackendOverloaded(f"{model.name} is overloaded ({status}): {detail}", model.name, status)
    raise BackendError(f"{model.name} answered {status}: {detail}", model.name, status)

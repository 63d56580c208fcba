"""Backend calls over real HTTP against the simulator."""

import json
import threading
import time
from contextlib import contextmanager

import pytest

from lanes import BackendError, BackendOverloaded, Lane, LeaseLost, Priority
from lanes.catalog import ModelInfo
from lanes.lane.hub import close_hubs
from lanes.routing import backend as backend_module
from lanes.routing.backend import BackendClient
from lanes.sim import SimModel, Simulator
from tests.polling import eventually


@pytest.fixture(scope="module")
def sim():
    models = [
        SimModel(name="chat", capacity=4, ttft_ms=20.0, per_token_ms=30.0, tokens=20),
        SimModel(name="fast", capacity=4, service_ms=5.0),
        SimModel(name="slow", capacity=4, service_ms=5000.0),
        SimModel(name="emb", capacity=4, kind="embedding", embedding_ms=5.0),
    ]
    with Simulator(models, port=0) as server:
        yield server


@pytest.fixture
def client():
    backend = BackendClient()
    yield backend
    backend.close()


def model(sim, name, kind="chat", key_env=None):
    return ModelInfo(name=name, base_url=sim.base_url, kind=kind, pool=None, service=None,
                     timeout_seconds=30.0, api_key_env=key_env)


def test_a_chat_is_streamed_and_assembled_with_its_first_token_time(sim, client):
    answer = client.call(model(sim, "fast"), {"messages": [{"role": "user", "content": "hi"}]}, timeout=10)
    assert answer.body["choices"][0]["message"]["content"]
    assert answer.ttft_seconds is not None and answer.ttft_seconds <= answer.seconds
    assert answer.chunks >= 1


def test_a_streamed_answer_leaves_its_connection_to_the_next_call(sim, client):
    # Its body read to the end after [DONE]: a body left unread closed the
    # connection, and every call paid a new one (lookup, connect, close).
    used = set()
    for _ in range(3):
        answer = client.call(model(sim, "fast"), {"messages": [{"role": "user", "content": "hi"}]}, timeout=10)
        assert answer.body["choices"][0]["message"]["content"]
        kept = client.connections()
        assert [connection.is_idle() for connection in kept] == [True]
        used.add(id(kept[0]))
    assert len(used) == 1, "a new connection per call"


def test_calls_at_once_each_get_a_connection_up_to_the_bound_and_keep_it(sim):
    # httpcore's pool looks at every connection it keeps whenever a request
    # starts or ends: kept connections are cheap only in small pools.
    bound = 6
    client = BackendClient(max_connections=bound)
    sim.configure("fast", capacity=bound + 2, service_ms=1000.0)  # all at once

    def calls(n: int) -> None:
        threads = [threading.Thread(target=client.call, args=(model(sim, "fast"), {"messages": []}),
                                    kwargs={"timeout": 10}) for _ in range(n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    try:
        calls(bound)
        kept = {id(c) for c in client.connections()}
        assert len(kept) == bound and all(len(s.http._transport._pool.connections) <= 1 for s in client._shards)
        calls(bound)  # the same connections again
        assert {id(c) for c in client.connections()} == kept
        calls(bound + 2)  # past the bound: two wait for a connection, none is added
        assert len(client._shards) == bound and len(client.connections()) == bound
        assert [shard.calls for shard in client._shards] == [0] * bound and len(client._free) == bound
    finally:
        sim.configure("fast", capacity=4, service_ms=5.0)
        client.close()


def test_embeddings_are_returned_as_the_backend_sent_them(sim, client):
    answer = client.call(model(sim, "emb", kind="embedding"), {"input": ["a", "b", "c"]}, timeout=10)
    assert len(answer.body["data"]) == 3


@pytest.mark.parametrize("status", [429, 503, 529])
def test_overload_answers_are_typed_as_overload(sim, client, status):
    sim.configure("fast", fail_next=1, fail_status=status)
    with pytest.raises(BackendOverloaded) as caught:
        client.call(model(sim, "fast"), {"messages": [{"role": "user", "content": "x"}]}, timeout=10)
    assert caught.value.status == status and not caught.value.request_rejected


def test_a_server_error_and_a_refused_request_are_told_apart(sim, client):
    sim.configure("fast", fail_next=1, fail_status=500)
    with pytest.raises(BackendError) as server_error:
        client.call(model(sim, "fast"), {"messages": [{"role": "user", "content": "x"}]}, timeout=10)
    assert server_error.value.status == 500 and not server_error.value.request_rejected
    with pytest.raises(BackendError) as refused:
        client.call(model(sim, "missing-model"), {"messages": [{"role": "user", "content": "x"}]}, timeout=10)
    assert refused.value.status == 404 and refused.value.request_rejected


def test_a_call_past_its_time_fails_as_a_timeout(sim, client):
    with pytest.raises(BackendError, match="did not finish|timed out"):
        client.call(model(sim, "chat"), {"messages": [{"role": "user", "content": "x"}]}, timeout=0.2)


def test_an_unreachable_backend_is_a_backend_error():
    backend = BackendClient()
    dead = ModelInfo(name="m", base_url="http://127.0.0.1:9/v1", kind="chat", pool=None, service=None,
                     timeout_seconds=5.0, api_key_env=None)
    with pytest.raises(BackendError, match="could not be reached"):
        backend.call(dead, {"messages": [{"role": "user", "content": "x"}]}, timeout=2)
    backend.close()


class Stop:
    """A caller's own stop signal: the Abort protocol a lane's Permit implements."""

    def __init__(self) -> None:
        self.stopping = False
        self._hooks: list = []
        self._lock = threading.Lock()
        self.said: list = []  # what each hook returned (True: it ended the call there)

    def on_stop(self, hook):
        with self._lock:
            if not self.stopping:
                self._hooks.append(hook)
                return lambda: self._hooks.remove(hook) if hook in self._hooks else None
        hook()
        return lambda: None

    def stop(self) -> None:
        with self._lock:
            self.stopping = True
            hooks, self._hooks = self._hooks, []
        self.said = [hook() for hook in hooks]


def wait_cancelled(sim, name: str) -> dict:
    return eventually(lambda: sim.stats()[name]["cancelled"] and sim.stats()[name], what="the backend's cancel")


@pytest.mark.parametrize("name", ["chat", "slow"], ids=["mid-stream", "silent-backend"])
def test_a_stop_aborts_the_call_at_once_and_frees_the_backend(sim, client, name):
    # "slow" sends nothing for 5 s: only the connection's cut can end it
    # before the backend finishes (it would then count it served).
    sim.reset()
    stop = Stop()
    threading.Timer(0.15, stop.stop).start()
    with pytest.raises(LeaseLost):
        client.call(model(sim, name), {"messages": [{"role": "user", "content": "x"}]}, timeout=10, abort=stop)
    stats = wait_cancelled(sim, name)
    assert stats["cancelled"] == 1 and stats["served"] == 0
    assert stop.said == [True], "the cut says it ended the call, so a slot asked back can go at once"
    # The cut connection is not reused: the next call is served.
    assert client.call(model(sim, "fast"), {"messages": [{"role": "user", "content": "x"}]}, timeout=10).status == 200


def test_a_background_call_asked_back_by_urgent_work_ends_at_once(sim, client, redis_client, monkeypatch):
    monkeypatch.setattr(backend_module, "STEP_ASIDE_SECONDS", 10.0)
    sim.reset()
    lane = Lane(redis_client, "pool:backend-yield", width=1, lease_seconds=5.0)
    lane.provision()
    try:
        permit = lane.acquire(Priority.BACKGROUND, 1.0)
        urgent: dict = {}
        threading.Timer(0.15, lambda: urgent.setdefault("permit", lane.acquire(Priority.INTERACTIVE, 10.0))).start()
        released_when_it_unwound = None
        try:
            client.call(model(sim, "slow"), {"messages": [{"role": "user", "content": "x"}]}, timeout=10,
                        abort=permit)
        except LeaseLost:
            released_when_it_unwound = permit.released
        assert permit.yield_asked
        stats = wait_cancelled(sim, "slow")
        assert stats["cancelled"] == 1 and stats["served"] == 0
        # The urgent side released the slot right after the cut, not the calling
        # thread, which stepped aside until it had (STEP_ASIDE_SECONDS is 10 s here).
        assert released_when_it_unwound is True
        assert not permit.release()
        eventually(lambda: urgent.get("permit"), what="the urgent grant").release()
    finally:
        close_hubs(redis_client)


class HandingStop(Stop):
    """A stop that, like an urgent waiter's ask, hands the slot over after the cut."""

    def __init__(self) -> None:
        super().__init__()
        self.handed = threading.Event()
        self.handed_at: float | None = None

    def wait_handed_over(self, timeout: float) -> None:
        self.handed.wait(timeout)

    def stop_and_hand_over(self, after: float) -> None:
        self.stop()
        time.sleep(after)  # the urgent side's release round trip, made long
        self.handed_at = time.monotonic()
        self.handed.set()


def test_a_cut_calls_thread_unwinds_only_once_its_slot_is_handed_over(sim, client, monkeypatch):
    monkeypatch.setattr(backend_module, "STEP_ASIDE_SECONDS", 10.0)
    assert client.steps_aside, "httpx's pool no longer takes the stepping network backend"
    sim.reset()
    stop = HandingStop()
    threading.Timer(0.15, stop.stop_and_hand_over, args=(0.3,)).start()
    with pytest.raises(LeaseLost):
        client.call(model(sim, "slow"), {"messages": [{"role": "user", "content": "x"}]}, timeout=10, abort=stop)
    unwound_at = time.monotonic()
    assert stop.said == [True] and stop.handed_at is not None and unwound_at >= stop.handed_at
    assert wait_cancelled(sim, "slow")["cancelled"] == 1


@pytest.mark.parametrize("stop", ["lease lost", "asked back, released by its own thread"])
def test_a_call_stopped_without_a_hand_over_does_not_wait_for_one(sim, client, redis_client, monkeypatch, stop):
    # Its own thread gives the slot back, so it must not step aside: were it to
    # wait for a hand-over here, the call would take STEP_ASIDE_SECONDS (30 s).
    monkeypatch.setattr(backend_module, "STEP_ASIDE_SECONDS", 30.0)
    sim.reset()
    lane = Lane(redis_client, f"pool:backend-no-handover-{stop[:5]}", width=1, lease_seconds=5.0)
    lane.provision()
    try:
        permit = lane.acquire(Priority.BACKGROUND, 1.0)
        threading.Timer(0.15, permit._mark_lost if stop == "lease lost" else permit._ask_yield).start()
        ended = threading.Event()

        def call() -> None:
            try:
                client.call(model(sim, "slow"), {"messages": [{"role": "user", "content": "x"}]}, timeout=10,
                            abort=permit)
            except LeaseLost:
                ended.set()

        threading.Thread(target=call, daemon=True).start()
        assert ended.wait(10), "the cut call's thread waited for a hand-over nobody makes"
        assert wait_cancelled(sim, "slow")["cancelled"] == 1
        permit.release()
    finally:
        close_hubs(redis_client)


@contextmanager
def stream_backend(body: bytes, seen: list | None = None):
    """A one-route backend answering every chat with ``body`` as a 200 event stream; yields its model."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Backend(BaseHTTPRequestHandler):
        def do_POST(self):
            if seen is not None:
                seen.append(self.headers.get("authorization"))
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield ModelInfo(name="h", base_url=f"http://127.0.0.1:{server.server_port}/v1", kind="chat", pool=None,
                        service=None, timeout_seconds=5.0, api_key_env="LANES_TEST_KEY")
    finally:
        server.shutdown()


def test_the_api_key_is_read_from_the_named_variable(client, monkeypatch):
    seen = []
    body = b'data: {"choices": [{"delta": {"content": "ok"}}]}\n\ndata: [DONE]\n\n'
    with stream_backend(body, seen) as hosted:
        monkeypatch.setenv("LANES_TEST_KEY", "sk-test")
        assert client.call(hosted, {"messages": [{"role": "user", "content": "x"}]}, timeout=5).body[
            "choices"][0]["message"]["content"] == "ok"
        monkeypatch.delenv("LANES_TEST_KEY")
        client.call(hosted, {"messages": [{"role": "user", "content": "x"}]}, timeout=5)
    assert seen == ["Bearer sk-test", None]


@pytest.mark.parametrize(("code", "status", "overloaded"), [(529, 529, True), ("429", 429, True), (500, 500, False),
                                                            (400, None, False)])
def test_an_error_inside_a_streamed_2xx_keeps_an_overload_status(client, code, status, overloaded):
    """vLLM-style mid-stream failure: HTTP 200, then ``data: {"error": ...}``. An overload
    code there is an overload (the failover share counts it as a breach); a 4xx other than
    429 is not taken for a refused request, since the stream had already begun."""
    error = json.dumps({"error": {"message": "busy", "code": code}}).encode()
    body = b'data: {"choices": [{"delta": {"content": "o"}}]}\n\ndata: ' + error + b"\n\ndata: [DONE]\n\n"
    with stream_backend(body) as hosted, pytest.raises(BackendError) as caught:
        client.call(hosted, {"messages": [{"role": "user", "content": "x"}]}, timeout=5)
    assert caught.value.status == status and not caught.value.request_rejected
    assert isinstance(caught.value, BackendOverloaded) == overloaded


@contextmanager
def held_stream_backend(body: bytes, before_answer):
    """A backend that runs ``before_answer()`` once the request is in, then
    sends ``body`` as one chunk of an event stream and holds the connection
    open (no end of the stream) until the test is done with it, so a reader
    can only end it by [DONE] or by shutting the connection. Yields the
    model and an event set when the backend closes: a call that returns
    before it is set did not wait for the close, however slow the machine."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    release, closed = threading.Event(), threading.Event()

    class Backend(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers["content-length"]))
            before_answer()
            head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                    + f"{len(body):x}\r\n".encode() + body + b"\r\n")
            self.wfile.write(head)  # one write: the answer arrives with the headers
            self.wfile.flush()
            release.wait(60.0)
            closed.set()
            self.close_connection = True

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield ModelInfo(name="h", base_url=f"http://127.0.0.1:{server.server_port}/v1", kind="chat", pool=None,
                        service=None, timeout_seconds=5.0, api_key_env=None), closed
    finally:
        release.set()
        server.shutdown()


ANSWER = b'data: {"choices": [{"delta": {"content": "done"}, "finish_reason": "stop"}]}\n\n'


def test_a_call_asked_back_after_its_whole_answer_arrived_is_served(client):
    # The backend finished the work: throwing the answer away would make the
    # walk call it a second time for the same task.
    stop = Stop()
    with held_stream_backend(ANSWER + b"data: [DONE]\n\n", stop.stop) as (hosted, closed):
        answer = client.call(hosted, {"messages": [{"role": "user", "content": "x"}]}, timeout=30, abort=stop)
        assert not closed.is_set(), "read to [DONE], not to the backend's close"
    assert answer.body["choices"][0]["message"]["content"] == "done"
    assert stop.stopping


def test_a_call_asked_back_before_its_answer_ended_is_cut_at_the_end_of_what_arrived(client):
    stop = Stop()
    with held_stream_backend(ANSWER, stop.stop) as (hosted, closed):
        with pytest.raises(LeaseLost):
            client.call(hosted, {"messages": [{"role": "user", "content": "x"}]}, timeout=30, abort=stop)
        assert not closed.is_set(), "the shut connection ended the read, not the backend's close"


def test_a_finishing_calls_short_read_limit_is_its_own_thread_only():
    # Its answer's end read, the connection is back in the pool before the
    # finishing thread takes the limit off: the next call on it must not read
    # under that limit (it would time out before its first token).
    import socket

    import httpcore

    server = socket.create_server(("127.0.0.1", 0))
    try:
        stream = backend_module._SteppingStream(
            httpcore.SyncBackend().connect_tcp("127.0.0.1", server.getsockname()[1], timeout=5))
        stream.limit_reads(0.05)
        started = time.monotonic()
        with pytest.raises(httpcore.ReadTimeout):
            stream.read(10, timeout=5.0)
        assert time.monotonic() - started < 1.0  # this thread: the short limit
        waited = []

        def next_call():
            started = time.monotonic()
            with pytest.raises(httpcore.ReadTimeout):
                stream.read(10, timeout=0.5)
            waited.append(time.monotonic() - started)

        other = threading.Thread(target=next_call)
        other.start()
        other.join()
        assert waited and waited[0] >= 0.45, waited  # another thread: its own limit
        stream.limit_reads(None)
        stream.close()
    finally:
        server.close()

"""Run the simulator: uvicorn servers on a private event loop in one thread.

The calling thread keeps working (a test, a benchmark, the CLI waiting for a
signal) while the simulator's loop serves every port. Reads and changes from
the calling thread are run *on* that loop, so they see and change the same
exact counts the HTTP handlers do.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, TypeVar

import uvicorn

from lanes.errors import LanesError
from lanes.sim.app import SimApp
from lanes.sim.fleet import Fleet
from lanes.sim.model import SimModel

T = TypeVar("T")


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass
class _Listener:
    app: SimApp
    server: uvicorn.Server
    task: asyncio.Task


class Simulator:
    """A simulated vLLM fleet on ``host``: the main ``port`` (0 picks a free one)
    serves every model without a port of its own, and each model with
    ``port=`` set is served on that port. Admin routes answer on every port.

    ``graceful_s`` bounds :meth:`stop`: requests still running then (a hung
    one, a long stream) are cancelled; one not yet answered gets a 503, a
    stream is ended.

    A port is one vLLM server: when a model on it dies (``down``) and is not
    kept alive, its port stops accepting connections, as vLLM's API server
    exits after its engine died; reviving the model (``down=False``, from
    Python or another port's admin route) listens on the same port again.
    """

    def __init__(
        self,
        models: Iterable[SimModel],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        graceful_s: float = 1.0,
    ) -> None:
        # A model whose own port is the main port is simply served there.
        self.fleet = Fleet(replace(m, port=None) if port and m.port == port else m for m in models)
        self.host = host
        self.graceful_s = graceful_s
        self._wanted_port = port
        self._ports: dict[int | None, int] = {}  # port key (None: main) -> bound port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._listeners: dict[int | None, _Listener] = {}  # port key -> its server while it listens
        for served in self.fleet.engines.values():
            served.death.on_server_exit = self._server_exit
            served.death.on_server_back = self._server_back

    # --- lifecycle -----------------------------------------------------------------

    def start(self) -> "Simulator":
        """Listen on every port; return once each one accepts connections."""
        if self._thread is not None:
            raise LanesError("the simulator is already started")
        sockets = {None: self._bind(self._wanted_port)}
        try:
            for port in self.fleet.extra_ports():
                sockets[port] = self._bind(port)
        except BaseException:
            for sock in sockets.values():
                sock.close()
            raise
        self._ports = {key: sock.getsockname()[1] for key, sock in sockets.items()}
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._run, args=(sockets, ready, failure), name="lanes-sim", daemon=True
        )
        self._thread.start()
        if not ready.wait(timeout=30) or failure:
            self.stop()
            raise LanesError(f"the simulator did not start: {failure[0] if failure else 'timed out'}")
        return self

    def stop(self) -> None:
        """Stop serving; safe to call twice."""
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass  # the loop already ended
        thread.join(timeout=self.graceful_s + 10)
        self._thread = self._loop = self._stop = None

    def __enter__(self) -> "Simulator":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _bind(self, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted
        # sockets only then, and without it an answer written in two parts
        # (headers, body) waits 40 ms for the client's delayed ACK.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, port))
        except OSError as exc:
            sock.close()
            raise LanesError(f"cannot listen on {self.host}:{port}: {exc.strerror or exc}") from None
        return sock

    def _run(self, sockets, ready: threading.Event, failure: list) -> None:
        try:
            asyncio.run(self._serve(sockets, ready))
        except BaseException as exc:  # reported to start(), which raises it
            failure.append(exc)
            ready.set()

    async def _serve(self, sockets: dict[int | None, socket.socket], ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        for key, sock in sockets.items():
            self._listen(key, sock)
        while not all(l.server.started for l in self._listeners.values()):
            if any(l.task.done() for l in self._listeners.values()):
                for listener in self._listeners.values():
                    listener.task.cancel()
                raise LanesError("a listener ended during startup")
            await asyncio.sleep(0.005)
        for served in self.fleet.engines.values():
            served.death.schedule_exits()  # a model started dead goes away as vLLM's server would
        ready.set()
        await self._stop.wait()
        listeners = list(self._listeners.values())
        # Ours to end, not uvicorn's: it would log each cancelled request.
        await asyncio.gather(*(l.app.drain(self.graceful_s) for l in listeners))
        for listener in listeners:
            listener.server.should_exit = True
        await asyncio.gather(*(l.task for l in listeners), return_exceptions=True)

    def _listen(self, key: int | None, sock: socket.socket) -> None:
        app = SimApp(self.fleet, key)
        config = uvicorn.Config(
            app,
            log_config=None,  # never reconfigure the host process's logging
            log_level="warning",
            access_log=False,
            lifespan="off",
            http="h11",
            backlog=2048,
            timeout_graceful_shutdown=self.graceful_s,
        )
        server = uvicorn.Server(config)
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        self._listeners[key] = _Listener(app, server, task)

    def _server_exit(self, served) -> None:
        """The server holding ``served`` exits: its port closes (on the loop)."""
        key = served.model.port
        listener = self._listeners.pop(key, None)
        if listener is None:
            return
        listener.app.stopping = True  # requests cut by the shutdown end cleanly
        listener.server.should_exit = True

    def _server_back(self, served) -> None:
        """``served`` is alive again: listen on its port again if it had closed."""
        key = served.model.port
        if key in self._listeners or self._stop is None or self._stop.is_set():
            return
        if any(other.model.port == key and other.death.exited and not other.death.balanced
               for other in self.fleet.engines.values() if other is not served):
            return  # another model of this server is still gone
        sock = self._bind(self._ports[key])
        sock.listen(2048)  # connections queue from now, before uvicorn serves them
        self._listen(key, sock)
        served.death.exited.clear()

    # --- addresses ------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._ports[None]

    @property
    def url(self) -> str:
        """The main port's URL, e.g. ``http://127.0.0.1:8700``."""
        return self._url(self._ports[None])

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def url_for(self, model: str) -> str:
        """The URL of the port that serves ``model``."""
        return self._url(self._ports[self.fleet.engine(model).model.port])

    def base_url_for(self, model: str) -> str:
        return self.url_for(model) + "/v1"

    def urls(self) -> dict[str, str]:
        """Every model's base URL (``.../v1``), by name."""
        return {name: self.base_url_for(name) for name in self.fleet.engines}

    def _url(self, port: int) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{port}"

    # --- state, read and changed on the loop ---------------------------------------

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per model: capacity, running, waiting, in_flight, peaks, counters."""
        return self._on_loop(self.fleet.stats)

    def calls(self) -> list[dict[str, str | None]]:
        """Every inference request so far (since the last reset), oldest first:
        model, task id and outcome (see :class:`lanes.sim.fleet.Call`)."""
        return self._on_loop(self.fleet.call_records)

    def reset(self, *, config: bool = False) -> None:
        """Zero the counters; peaks restart from now. ``config``: also restore
        every model's start settings and clear injected failures."""
        self._on_loop(lambda: self.fleet.reset(config=config))

    def configure(
        self,
        name: str,
        *,
        capacity: int = UNSET,
        kind: str = UNSET,
        overflow: str = UNSET,
        reject_status: int = UNSET,
        gateway_kv_threshold: float | None = UNSET,
        gateway_prefill_tokens_threshold: int | None = UNSET,
        max_num_queued_reqs: int | None = UNSET,
        max_num_queued_tokens: int | None = UNSET,
        kv_blocks: int = UNSET,
        block_size: int = UNSET,
        max_num_batched_tokens: int = UNSET,
        max_model_len: int | None = UNSET,
        service_ms: float | None = UNSET,
        ttft_ms: float = UNSET,
        per_token_ms: float = UNSET,
        per_seq_ms: float = UNSET,
        prefill_ms_per_token: float = UNSET,
        context_ms_per_1k: float = UNSET,
        tokens: int = UNSET,
        distribution: str = UNSET,
        sigma: float = UNSET,
        seed: int = UNSET,
        defer_ms: float = UNSET,
        tokenize_ms: float = UNSET,
        embedding_ms: float = UNSET,
        embedding_dim: int = UNSET,
        fail_rate: float = UNSET,
        fail_status: int = UNSET,
        down: bool = UNSET,
        down_replicas: list[int] | tuple[int, ...] = UNSET,
        keep_alive_on_engine_death: bool = UNSET,
        exit_after_death_s: float = UNSET,
        balancer_status: int = UNSET,
        hang_s: float = UNSET,
        metrics_flavor: str = UNSET,
        metrics_lag_s: float = UNSET,
        fail_next: int = UNSET,
        hang_next: int = UNSET,
        error_next: int = UNSET,
    ) -> dict[str, Any]:
        """Change a model at runtime, as ``POST /admin/models/{name}`` does.

        ``fail_next=N`` answers the next N requests ``fail_status``;
        ``hang_next=N`` makes the next N admitted requests stall ``hang_s``
        while holding their slot; ``error_next=N`` makes the next N fail after
        their first token (a stream gets HTTP 200, then an error frame, then
        ``[DONE]``); ``down=True`` kills the engine (500 per request, 503 on
        /health, requests it held fail; its port closes ``exit_after_death_s``
        later, or once it answered a request, unless
        ``keep_alive_on_engine_death``); ``down_replicas=[i]`` kills replica
        ``i`` behind the balancer. Returns the model's stats.
        """
        changes = {k: v for k, v in locals().items() if k not in ("self", "name") and v is not UNSET}
        return self._on_loop(lambda: self.fleet.configure(name, changes))

    def _on_loop(self, fn: Callable[[], T]) -> T:
        loop = self._loop
        if loop is None or loop.is_closed() or self._thread is None:
            return fn()  # not serving: nothing else touches the state
        if self._thread is threading.current_thread():
            return fn()
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

        loop.call_soon_threadsafe(run)
        return future.result(timeout=30)

"""A dead engine's server going away, as vLLM's API server does.

vLLM's API server sets ``should_exit`` when its engine is dead: in the
EngineDeadError handler, right after answering a request 500, and in a
watchdog every 5 s (``vllm/entrypoints/launcher.py``), unless
``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``. Callers then get connection refused, or
a balancer's answer when one stands in front.

Here: ``exit_after_death_s`` after an engine died, or as soon as it answered
a request, its server exits, unless ``keep_alive_on_engine_death``. A lone
server (or data-parallel ranks: one server) is one listener, so the
simulator closes its port (``on_server_exit``) and opens it again when the
model is revived (``on_server_back``). Replicas behind a balancer are each a
server of their own: the balancer stays, and answers for a gone one with
``balancer_status`` (:data:`BALANCER_ANSWERS`).
"""

from __future__ import annotations

import asyncio
from typing import Callable

# vLLM's words for a dead engine (EngineDeadError).
DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
# What common balancers answer when the upstream they picked refuses connections.
BALANCER_ANSWERS = {
    502: (b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway"
          b"</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n", b"text/html"),
    503: (b"upstream connect error or disconnect/reset before headers. reset reason: connection failure",
          b"text/plain"),
}


class ServerDeath:
    """When the servers of one model's dead engines exit (on the simulator's loop).

    ``served`` is the :class:`lanes.sim.served.ServedModel` that owns this
    (named, not imported: the served model builds its death, not the reverse).
    """

    def __init__(self, served) -> None:
        self.served = served
        self.exited: set[int] = set()  # engines whose server is gone
        self._exit_timers: dict[int, asyncio.TimerHandle] = {}
        # Set by the simulator: close or reopen this model's port (a lone server exits).
        self.on_server_exit: Callable[[object], None] | None = None  # called with ``served``
        self.on_server_back: Callable[[object], None] | None = None

    @property
    def model(self):
        return self.served.model

    @property
    def balanced(self) -> bool:
        """Separate servers behind a load balancer (else one server: one listener)."""
        return self.model.replicas > 1 and not self.model.data_parallel

    def _dead(self) -> list[int]:
        return [i for i in range(len(self.served.cores)) if self.model.engine_down(i)]

    def schedule_exits(self, *, revive: bool = False) -> None:
        """Arm the exit of every dead engine's server; with ``revive``, bring back
        the servers of engines alive again."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        m = self.model
        dead = set(self._dead())
        for index in list(self._exit_timers):
            if index not in dead or m.keep_alive_on_engine_death:
                self._exit_timers.pop(index).cancel()
        if revive:
            self.exited -= {i for i in self.exited if i not in dead}
            if not dead and self.on_server_back is not None:
                self.on_server_back(self.served)
        if m.keep_alive_on_engine_death:
            return
        for index in dead:
            if index not in self._exit_timers and index not in self.exited:
                self._exit_timers[index] = loop.call_later(m.exit_after_death_s, self.exit_server, index)

    def exit_server(self, index: int) -> None:
        """The server of dead engine ``index`` exits (if still dead and not kept alive)."""
        timer = self._exit_timers.pop(index, None)
        if timer is not None:
            timer.cancel()
        if not self.model.engine_down(index) or self.model.keep_alive_on_engine_death:
            return
        if self.balanced:
            self.exited.add(index)
        else:
            self.exited.update(range(len(self.served.cores)))
            if self.on_server_exit is not None:
                self.on_server_exit(self.served)

"""All the simulated models of one simulator, by name and by port."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from typing import Any, Iterable

from lanes.errors import InvalidInput
from lanes.sim.served import Device, ServedModel, Ticket
from lanes.sim.model import SimModel


# The header a Lanes worker sends with every backend call, naming its task.
TASK_HEADER = b"x-lanes-task"
CALL_RECORD_LIMIT = 100_000


@dataclass
class Call:
    """One inference request as received: its model, the task id it carried,
    and how it ended (``served``, ``rejected``, ``failed``, ``cancelled`` when
    the client left first; None while running or when refused before the
    engine saw it)."""

    model: str
    task_id: str | None
    ticket: Ticket | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {"model": self.model, "task_id": self.task_id,
                "outcome": self.ticket.outcome if self.ticket is not None else None}


class Fleet:
    def __init__(self, models: Iterable[SimModel]) -> None:
        # Every inference request as it arrived: (model, task id or None), oldest
        # first, bounded; fault tests count calls per task from it.
        self.calls: deque[Call] = deque(maxlen=CALL_RECORD_LIMIT)
        self.engines: dict[str, ServedModel] = {}
        self.devices: dict[str, Device] = {}
        for model in models:
            if model.name in self.engines:
                raise InvalidInput(f"model {model.name!r} is listed twice")
            device = None
            if model.device is not None:
                device = self.devices.setdefault(model.device, Device(model.device))
            self.engines[model.name] = ServedModel(model, device)
        if not self.engines:
            raise InvalidInput("the simulator needs at least one model")

    def engine(self, name: str) -> ServedModel:
        try:
            return self.engines[name]
        except KeyError:
            raise InvalidInput(f"unknown model {name!r} (known: {', '.join(sorted(self.engines))})") from None

    def on_port(self, port: int | None) -> dict[str, ServedModel]:
        """The engines served on ``port`` (None: the main port)."""
        return {name: e for name, e in self.engines.items() if e.model.port == port}

    def extra_ports(self) -> list[int]:
        return sorted({e.model.port for e in self.engines.values() if e.model.port is not None})

    def stats(self) -> dict[str, dict[str, Any]]:
        return {name: engine.stats() for name, engine in self.engines.items()}

    def configure(self, name: str, changes: dict[str, Any]) -> dict[str, Any]:
        engine = self.engine(name)
        engine.configure(changes)
        return engine.stats()

    def record_call(self, model: object, task_id: str | None) -> Call:
        call = Call(str(model), task_id)
        self.calls.append(call)
        return call

    def call_records(self) -> list[dict[str, str | None]]:
        return [call.as_dict() for call in self.calls]

    def reset(self, *, config: bool = False) -> None:
        self.calls.clear()
        for engine in self.engines.values():
            if config:
                engine.restore()
            engine.reset_counters()
        for device in self.devices.values():
            device.reset()

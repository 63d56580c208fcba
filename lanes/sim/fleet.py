"""All the simulated models of one simulator, by name and by port."""

from __future__ import annotations

from typing import Any, Iterable

from lanes.errors import InvalidInput
from lanes.sim.served import Device, ServedModel
from lanes.sim.model import SimModel


class Fleet:
    def __init__(self, models: Iterable[SimModel]) -> None:
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

    def reset(self, *, config: bool = False) -> None:
        for engine in self.engines.values():
            if config:
                engine.restore()
            engine.reset_counters()
        for device in self.devices.values():
            device.reset()

"""Serving ``/metrics`` from workers.

A fleet worker (``lanes worker``) is a supervisor process that runs the
Celery worker as a child and replaces that child, old and new side by side
for a while, whenever the catalog resizes the fleet. So the port belongs to
the supervisor, which outlives its children: :class:`SupervisedExposition`
gives every child a ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's
multiprocess mode: each process writes its values to files there), and
serves the children's values summed (counters and histograms of a replaced
child keep counting) together with the lane gauges read from Redis.

A worker started on its own (``celery -A workers.app worker``, tests) with
``LANES_METRICS_PORT`` serves its own default registry instead
(:func:`serve`); a child of a supervisor never binds the port itself.

Both listen on ``LANES_METRICS_HOST``, this host only (127.0.0.1) unless
told otherwise: a container that Prometheus scrapes from another one sets
0.0.0.0.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

from dataclasses import fields

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client import multiprocess

from lanes.errors import InvalidInput
from lanes.metrics.collector import LaneCollector
from lanes.instruments import instruments

log = logging.getLogger("lanes.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def under_supervisor() -> bool:
    """Whether this process writes its values for a supervisor to serve."""
    return bool(os.environ.get(MULTIPROC_ENV))


def serve(port: int, registry=None, *, addr: str = "127.0.0.1"):
    """Serve ``registry`` (default: the process's) on ``port``; returns the server (``shutdown()`` stops it)."""
    from prometheus_client import REGISTRY

    try:
        server, _thread = start_http_server(port, addr=addr, registry=registry or REGISTRY)
    except OSError as exc:
        raise InvalidInput(
            f"cannot serve /metrics on port {port} ({exc.strerror or exc}); set LANES_METRICS_PORT to a free "
            "port (each worker on one host needs its own), or 0 to serve none"
        ) from None
    log.info("serving /metrics on %s port %d", addr, server.server_port)
    return server


class ChildrenCollector(multiprocess.MultiProcessCollector):
    """The children's values, and every Lanes family they have no value for yet
    (empty), so a scrape always names the same families whatever has happened."""

    def collect(self):
        found = list(super().collect())
        names = {metric.name for metric in found}
        m = instruments()
        for field in fields(m):
            for family in getattr(m, field.name).describe():
                if family.name not in names:
                    found.append(family)
        return found


class SupervisedExposition:
    """The supervisor's ``/metrics``: its children's values (multiprocess) and the lane gauges."""

    def __init__(self, port: int, collector: LaneCollector, *, addr: str = "127.0.0.1") -> None:
        self.folder = tempfile.mkdtemp(prefix="lanes-metrics-")
        self.registry = CollectorRegistry()
        ChildrenCollector(self.registry, path=self.folder)
        self.registry.register(collector)
        self.collector = collector
        try:
            self.server = serve(port, self.registry, addr=addr)
        except BaseException:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise

    @property
    def port(self) -> int:
        return self.server.server_port

    def child_env(self) -> dict[str, str]:
        """Environment entries for a child worker process."""
        return {MULTIPROC_ENV: self.folder}

    def child_exited(self, pid: int) -> None:
        """Drop a dead child's live gauges (its counters keep counting in the sums)."""
        multiprocess.mark_process_dead(pid, self.folder)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.folder, ignore_errors=True)


def supervised(settings, table) -> SupervisedExposition | None:
    """A supervisor's exposition on ``settings.metrics_port`` (None when it is 0),
    with the lane gauges of the catalog ``table`` callable gives."""
    if not settings.metrics_port:
        return None
    from lanes.metrics import lane_collector

    return SupervisedExposition(settings.metrics_port, lane_collector(settings, table=table),
                                addr=settings.metrics_host)

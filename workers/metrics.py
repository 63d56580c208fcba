"""A worker's own ``/metrics`` when it runs without a supervisor.

``lanes worker`` serves a fleet's metrics from its supervisor (see
:mod:`lanes.metrics.exposition`) and its worker child only writes values for
it. A worker started some other way (``celery -A workers.app worker``, a
test) with ``LANES_METRICS_PORT`` serves its default registry, lane gauges
included, from this bootstep.
"""

from __future__ import annotations

from celery import bootsteps

from lanes.metrics import install
from lanes.metrics.exposition import serve, under_supervisor


class MetricsEndpoint(bootsteps.StartStopStep):
    def __init__(self, worker, **kwargs) -> None:
        super().__init__(worker, **kwargs)
        self.server = None

    def start(self, worker) -> None:
        settings = worker.app.lanes_context.settings
        if not settings.metrics_port or under_supervisor():
            return
        install(settings)
        self.server = serve(settings.metrics_port, addr=settings.metrics_host)

    def stop(self, worker) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

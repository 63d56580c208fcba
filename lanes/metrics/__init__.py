"""Prometheus metrics of Lanes (the names, labels and meanings: docs/METRICS.md).

- Process metrics (:mod:`lanes.instruments`): counters, histograms and
  gauges on prometheus_client's default registry, created on first use. The
  walker's reports reach them through
  :class:`lanes.routing.metrics_observer.MetricsObserver` (one entry of
  ``Runtime.observers``); width changes, retries, the memory gate and memory
  runs through the functions of :mod:`lanes.instruments.counts`.
- Lane gauges (:class:`LaneCollector`): read from Redis at scrape time for
  every pool of the catalog, so every process shows the same lanes.
- :func:`install` registers the collector on the default registry, once per
  process: the worker and the API call it, then expose the default registry
  (:func:`render` gives the text and its content type).

Importing this package reads nothing and connects nowhere.
"""

from __future__ import annotations

import threading

from lanes.instruments import (events_dropped, handback_possibly_lost, instruments, memory_gate, memory_runs, retried,
                               retried_walk, status_class, width_changed)
from lanes.metrics.collector import LaneCollector
from lanes.settings import Settings

__all__ = [
    "LaneCollector",
    "events_dropped",
    "handback_possibly_lost",
    "install",
    "instruments",
    "lane_collector",
    "memory_gate",
    "memory_runs",
    "render",
    "retried",
    "retried_walk",
    "status_class",
    "width_changed",
]

_lock = threading.Lock()
_installed: dict[int, LaneCollector] = {}


def lane_collector(settings: Settings, *, client=None, table=None, cache_seconds: float = 2.0) -> LaneCollector:
    """A lane collector for ``settings``' Redis and catalog (``client``/``table`` to share a process's own)."""
    if client is None:
        from lanes.redis_conn import connect, resolve_redis_url

        client = connect(resolve_redis_url(settings, start_embedded=False), timeout=settings.redis_timeout_seconds)
    if table is None:
        table = _lazy_catalog(settings)
    return LaneCollector(settings, client, table, cache_seconds=cache_seconds)


def _lazy_catalog(settings: Settings):
    """The catalog's routing table, opened at the first scrape (not at install)."""
    view = None

    def table():
        nonlocal view
        if view is None:
            from lanes.catalog import open_catalog
            from lanes.routing.view import CatalogView

            view = CatalogView(open_catalog(settings, create=False), refresh_seconds=5.0)
        return view.table()

    return table


def install(settings: Settings, *, registry=None, client=None, table=None) -> LaneCollector:
    """Create the process metrics and register the lane collector on ``registry``
    (default: prometheus_client's default registry); once per registry, so a
    second call returns the first collector. Connects nowhere until a scrape."""
    from prometheus_client import REGISTRY

    from lanes.routing.share_metrics import share_metrics

    registry = registry or REGISTRY
    instruments()
    share_metrics()  # the failover share's families, named before any request
    with _lock:
        collector = _installed.get(id(registry))
        if collector is None:
            collector = lane_collector(settings, client=client, table=table)
            registry.register(collector)
            _installed[id(registry)] = collector
        return collector


def render(registry=None) -> tuple[bytes, str]:
    """The exposition text of ``registry`` (default: the default registry) and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    return generate_latest(registry or REGISTRY), CONTENT_TYPE_LATEST

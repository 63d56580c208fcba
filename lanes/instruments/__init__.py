"""What a process of Lanes counts: its Prometheus instruments, and the calls that count on them.

- :mod:`lanes.instruments.families`: the counters, histograms and gauges
  (created on first use, once per process) and :func:`status_class`;
- :mod:`lanes.instruments.counts`: one call per thing counted outside the
  walker (width changes, retries, the memory gate, memory runs, ...).

Below everything that counts (the width authority, the control loop, the
routing, the memory feature, the workers): it imports nothing of Lanes but
the priorities. What reads and serves the values is :mod:`lanes.metrics`.
Importing this package creates nothing and connects nowhere.
"""

from lanes.instruments.counts import (events_dropped, handback_possibly_lost, memory_gate, memory_runs, retried,
                                      retried_walk, width_changed)
from lanes.instruments.families import instruments, status_class

__all__ = [
    "events_dropped",
    "handback_possibly_lost",
    "instruments",
    "memory_gate",
    "memory_runs",
    "retried",
    "retried_walk",
    "status_class",
    "width_changed",
]

"""The memory runs' processes: the worker that runs them, and its fleet.

- :mod:`workers.memory.worker`: the Celery worker of the memory queue; each
  task is one chat hour's extraction, routed through the lanes at background
  priority (``python -m workers.memory.worker --concurrency N``);
- :mod:`workers.memory.fleet`: how many worker threads the memory primary's
  width calls for, kept by the fleet supervisor (:mod:`workers.supervisor`)
  as every fleet is (``lanes memory worker``).

What a memory run is (history, runs, claims, dispatch) is :mod:`lanes.memory`;
the beat that creates the runs is :mod:`scheduler`.
"""

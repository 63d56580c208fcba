"""Lanes in Flower: the lane queues on the Broker page, each task's routing
in its columns, its lane waits, admissions and bypasses on its page, each
worker's lanes on the worker page.

- :mod:`lanes.flower.lane_events`: the custom task events workers send;
- :mod:`lanes.flower.config`: the options and Celery app ``lanes flower`` runs with;
- :mod:`lanes.flower.server`: Flower with the lane queues and lane events.

Nothing here imports Flower until :mod:`lanes.flower.server` is imported.
"""

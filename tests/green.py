"""Run tests with gevent's monkey patching, as a fleet worker runs (workers/main.py).

    python -m pytest -p tests.green tests/lane

Loaded with ``-p`` it patches before the conftest imports Lanes, so the lane
client, hub, renewer, breakers and backend client run cooperatively, on green
threads, exactly as in a worker of the gevent pool.
"""

from gevent import monkey

monkey.patch_all()


def pytest_report_header(config) -> str:
    return "green: gevent monkey patching is on (a fleet worker's runtime)"

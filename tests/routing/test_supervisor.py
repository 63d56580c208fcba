"""The fleet supervisor's checks before it starts anything."""

import os
import subprocess
import sys

import pytest

from lanes import InvalidInput
from lanes.catalog import apply_document, load_routing, open_catalog
from workers.supervisor import check_timeouts_fit, fleet_timeout_seconds

DOC = {
    "pools": [{"name": "gpu", "width": 1}],
    "models": [
        {"name": "fast", "base_url": "http://127.0.0.1:9/v1", "pool": "gpu", "timeout_ms": 20_000},
        {"name": "patient", "base_url": "http://127.0.0.1:9/v1", "timeout_ms": 45_000},
    ],
    "workflows": [{"name": "w", "candidates": ["fast", "patient"]}],
}


@pytest.fixture
def settings(make_settings):
    return make_settings(visibility_timeout_seconds=60)


@pytest.fixture
def table(settings):
    engine = open_catalog(settings)
    apply_document(engine, DOC)
    return load_routing(engine)


def test_the_fleets_longest_timeout_counts_its_fallbacks_too(table):
    assert fleet_timeout_seconds(table, "gpu") == 45.0


def test_a_model_timeout_that_cannot_fit_below_the_visibility_timeout_is_refused(table, settings):
    # Visibility 60 s leaves a walk 30 s: the 45 s fallback cannot fit.
    with pytest.raises(InvalidInput, match=r"patient \(timeout_ms 45000\) cannot finish a call within the 30s"):
        check_timeouts_fit(table, "gpu", settings)
    check_timeouts_fit(table, "gpu", settings.model_copy(update={"visibility_timeout_seconds": 600}))


def test_the_supervisor_refuses_such_a_fleet_in_one_line_with_exit_2(table, settings):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANES_")}
    env.update(LANES_STATE_DIR=str(settings.state_dir), LANES_DATABASE_URL=settings.catalog_url(),
               LANES_REDIS_URL="redis://127.0.0.1:1/0", LANES_VISIBILITY_TIMEOUT_SECONDS="60")
    done = subprocess.run([sys.executable, "-m", "workers.supervisor", "--fleet", "gpu"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("error: fleet 'gpu': patient (timeout_ms 45000)") and "Traceback" not in done.stderr
    assert "LANES_VISIBILITY_TIMEOUT_SECONDS" in done.stderr

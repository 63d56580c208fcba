"""A fleet's workers keep their names across resizes, so Flower lists the same
one or two workers per role, not a new (soon offline) one per resize."""

from __future__ import annotations

import json
import socket

import pytest

from lanes.catalog import apply_document
from lanes.sim import SimModel
from tests.cli.conftest import DOC
from tests.e2e.harness import deploy
from tests.polling import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def test_resizes_reuse_the_fleets_worker_names(tmp_path, one_redis_url):
    dep = deploy(tmp_path / "state", one_redis_url, json.loads(json.dumps(DOC)),
                 [SimModel(name="m", capacity=8), SimModel(name="n", capacity=8)], ["gpu"])
    host = socket.gethostname()
    seen: set[str] = set()
    try:
        def names() -> set[str]:
            return {name for reply in dep.client.celery.control.ping(timeout=2.0) or [] for name in reply}

        seen |= eventually(lambda: names() or None, timeout=60, interval=0.5, what="the fleet to answer pings")
        for width in (3, 4, 5, 6):
            before = set(dep.worker_children("gpu"))
            document = json.loads(json.dumps(DOC))
            document["pools"][0]["width"] = width
            document["models"] = [{**m, "base_url": dep.sim.base_url} for m in document["models"]]
            apply_document(dep.client.engine, document)
            eventually(lambda: not before & set(dep.worker_children("gpu")) and len(dep.worker_children("gpu")) == 2,
                       timeout=120, interval=0.5, what=f"the fleet resized to {width}, its old workers gone")
            seen |= eventually(lambda: (found := names()) and len(found) == 2 and found, timeout=60, interval=0.5,
                               what="the new workers to answer")
    finally:
        dep.close()
    # Four resizes, and still only two names per role: each replaces the other.
    assert seen <= {f"gpu@{host}", f"gpu@{host}-2", f"gpu@{host}.background", f"gpu@{host}.background-2"}, seen

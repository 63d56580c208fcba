"""Scenario 6: a fork after the hub started. The child gets its own token, ids,
hub and renewer; the parent's permits it inherited are not its own (lost in
the child, and its release changes nothing); meta never drifts."""

from __future__ import annotations

import json
import os
import time

from lanes import Priority

I = Priority.INTERACTIVE
LEASE = 1.0


def _child(lane, inherited, write_end) -> None:
    report = {}
    try:
        report["inherited_lost"] = inherited.lost.is_set()
        report["inherited_release"] = inherited.release()
        own = lane.acquire(I, 2.0)
        report["own_id"] = own.holder_id
        time.sleep(2.5 * LEASE)  # longer than a lease: only a renewer of the child's own keeps it
        try:
            own.check()
            report["own_valid"] = True
        except Exception as exc:  # reported to the parent, which asserts
            report["own_valid"] = repr(exc)
        report["own_on_server"] = lane.client.zscore(lane.keys.all()[1], own.holder_id) is not None
        report["own_release"] = own.release()
    except BaseException as exc:  # the child never returns into pytest
        report["error"] = repr(exc)
    finally:
        os.write(write_end, json.dumps(report).encode())
        os._exit(0)


def test_a_child_forked_after_use_has_its_own_hub_ids_and_permits(make_lane):
    lane = make_lane(width=3, lease_seconds=LEASE)
    inherited = lane.acquire(I, 2.0)       # the hub, its renewer and the id counter are in use
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        _child(lane, inherited, write_end)
    os.close(write_end)
    mine = lane.acquire(I, 2.0)            # the parent goes on making ids
    chunks = []
    while True:
        chunk = os.read(read_end, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.waitpid(pid, 0)
    os.close(read_end)
    report = json.loads(b"".join(chunks))
    assert "error" not in report, report
    assert report["inherited_lost"] is True, "the parent's permit is not the child's"
    assert report["inherited_release"] is False, "the child cannot release the parent's slot"
    assert report["own_id"].split(".")[0] != mine.holder_id.split(".")[0], "the child has its own token"
    assert report["own_id"] != mine.holder_id
    assert report["own_valid"] is True and report["own_on_server"], "the child renews its own permit"
    assert report["own_release"] is True
    # The parent's permits were kept alive by the parent's renewer throughout.
    inherited.check()
    mine.check()
    meta, holders = lane.keys.all()[:2]
    assert int(lane.client.hget(meta, "inflight")) == lane.client.zcard(holders) == 2
    assert inherited.release() and mine.release()
    assert int(lane.client.hget(meta, "inflight")) == lane.client.zcard(holders) == 0

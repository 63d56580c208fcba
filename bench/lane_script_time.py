"""Redis server time of the lane's scripts, per call, from SLOWLOG on a
private redis-server (``slowlog-log-slower-than 0`` records every command
with its duration in microseconds, and no other client's calls mix in).

    python bench/lane_script_time.py [cycles] [pause_seconds]
    python bench/lane_script_time.py --smoke    # 50 cycles

The handoff cycle, as the handoff benchmark makes it: a waiter of this
process queues, ``pause_seconds`` pass (0.002 = the 2 ms the handoff phase
lets its waiter sleep, so the release runs cold), the holder releases and
the lean handoff grants the waiter (doorbell published to this process's own
channel), and the waiter is the next round's holder. Then the uncontended
pair (acquire + release, nobody waiting). Prints the median per script call.

Runs against the lanes package on ``PYTHONPATH`` (it uses only what the lane
had before issue 9 too, so it compares an old tree with a new one), and
always on an embedded redis-server of its own: SLOWLOG settings are
server-wide, so it never touches a shared Redis.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

from lanes import Lane, Priority
from lanes.embedded import EmbeddedRedis
from lanes.lane.base import new_id
from lanes.lane.hub import close_hubs
from lanes.lane.model import Generation, Permit

I = Priority.INTERACTIVE


def durations(client, names: dict) -> dict:
    """{script name: [us]} of the EVALSHA calls logged since the last reset."""
    out: dict = {}
    for entry in client.slowlog_get(100_000):
        cmd = entry["command"].split()
        if cmd[0].upper() == b"EVALSHA":
            out.setdefault(names.get(cmd[1].decode(), "?"), []).append(entry["duration"])
    client.slowlog_reset()
    return out


def main(argv: list[str]) -> int:
    smoke = "--smoke" in argv  # a quick pass (dev.py bench --smoke): 50 cycles
    argv = [a for a in argv if a != "--smoke"]
    cycles = int(argv[0]) if argv else (50 if smoke else 1000)
    pause = float(argv[1]) if len(argv) > 1 else 0.0
    server = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="lanes-script-time-")))
    try:
        client = redis.Redis.from_url(server.ensure())
        client.config_set("slowlog-log-slower-than", 0)
        client.config_set("slowlog-max-len", 100_000)
        lane = Lane(client, "script-time", width=1, prefix=f"lanes:bench:{uuid.uuid4().hex[:8]}")
        lane.provision()
        holder = lane.acquire(I, 1.0)
        hub = lane._hub
        names = {script.sha: name for name, script in lane._scripts.scripts.items()}
        hinfo = lane.keys.all()[2]
        client.slowlog_reset()
        for _ in range(cycles):
            waiter = new_id(hub.token)
            lane._acquire_call(hub, waiter, I, 60_000, False, True)  # queued: the lane is full
            if pause:
                time.sleep(pause)
            assert lane.release(holder), "the release must hand off"
            epoch, counter, *_ = client.hget(hinfo, waiter).decode().split(":")
            holder = Permit(lane, holder_id=waiter, generation=Generation(int(epoch), int(counter)), priority=I,
                            waited_seconds=0.0, lease_until=time.monotonic() + lane.lease_seconds)
        cycle = durations(client, names)
        lane.release(holder)
        client.slowlog_reset()
        for _ in range(cycles):
            lane.acquire(I, 1.0).release()
            if pause:
                time.sleep(pause)
        pair = durations(client, names)
        close_hubs(client)
    finally:
        server.stop()
    med = statistics.median
    print(f"handoff cycle ({cycles}, pause {pause * 1000:.0f} ms): queued acquire {med(cycle['acquire']):.1f} us, "
          f"release with handoff {med(cycle['release']):.1f} us; uncontended pair: acquire "
          f"{med(pair['acquire']):.1f} us, release {med(pair['release']):.1f} us (SLOWLOG medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

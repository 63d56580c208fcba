"""A renamed fleet's queued work moves to the new queues, in order, and wakes their consumers.

Real Redis: messages queued under the old name as kombu queues them, moved by
the supervisor's drain, then read back the way a consumer takes them.
"""

from __future__ import annotations

import json

from lanes.broker import bell_key
from lanes.celery_client import fleet_queues
from workers.drain import queue_separator, drain_fleet, queue_keys


def message(n: int, queue: str) -> str:
    return json.dumps({"body": str(n), "properties": {"delivery_info": {"exchange": queue, "routing_key": queue}}})


def test_moved_messages_keep_their_order_take_the_new_route_and_ring_the_new_bell(redis_client, make_settings):
    settings = make_settings()
    old_queue, new_queue = fleet_queues("old-pool")[0], fleet_queues("new-pool")[0]
    old_key, new_key = queue_keys(settings, old_queue)[0], queue_keys(settings, new_queue)[0]
    bell = bell_key(new_queue, queue_separator(settings))
    for n in range(5):                      # kombu: LPUSH in, BRPOP (the right end) out
        redis_client.lpush(old_key, message(n, old_queue))

    assert drain_fleet(redis_client, settings, "old-pool", "new-pool") == 5

    assert redis_client.llen(old_key) == 0
    taken = [json.loads(redis_client.rpop(new_key)) for _ in range(5)]
    assert [m["body"] for m in taken] == ["0", "1", "2", "3", "4"]
    assert {m["properties"]["delivery_info"]["routing_key"] for m in taken} == {new_queue}
    # A worker blocked on the new queue's bell wakes for the moved messages
    # instead of finding them at its next poll.
    assert redis_client.xlen(bell) == 1


def test_nothing_to_move_rings_no_bell(redis_client, make_settings):
    settings = make_settings()
    new_queue = fleet_queues("new-pool")[0]
    assert drain_fleet(redis_client, settings, "old-pool", "new-pool") == 0
    assert redis_client.xlen(bell_key(new_queue, queue_separator(settings))) == 0

"""The guaranteed share per workflow within a priority (issue 14, seed 001).

Most tests drive the scripts with synthetic ids (notify 0, so a grant needs
no listener) and read who was granted from the holder entries: a thousand
waiters cost a thousand script calls, not a thousand threads. One test goes
through ``Lane.acquire(workflow=...)`` with real waiting threads.
"""

from __future__ import annotations

import threading

import pytest

from lanes import InvalidInput, Priority

I, U = Priority.INTERACTIVE, Priority.USER_TOOL


class Driver:
    """Waiters and holders of one lane, by script call."""

    def __init__(self, lane) -> None:
        self.lane = lane
        self.client = lane.client
        self.keys = lane.keys.all()
        self.ids = iter(range(10**9))
        self.workflow: dict[str, str] = {}

    def acquire(self, workflow: str, priority: Priority = U, name: str | None = None) -> tuple[str, str]:
        wid = name or f"drv.{next(self.ids)}"
        self.workflow[wid] = workflow
        reply = self.lane._script("acquire", [wid, int(priority), -1, self.lane.lease_ms, "", "0", "0", "1", "",
                                              workflow])
        return wid, reply[0].decode()

    def holders(self) -> set[str]:
        return {h.decode() for h in self.client.zrange(self.keys[1], 0, -1)}

    def release(self, wid: str) -> list[str]:
        """Release ``wid``; returns who was granted by it, in grant order."""
        before = self.holders()
        epoch, counter = self.client.hget(self.keys[2], wid).decode().split(":")[:2]
        reply = self.lane._script("release", [wid, epoch, counter, self.lane.lease_ms, 0])
        assert int(reply[0]) == 1
        new = self.holders() - before
        # Generations order the grants of one call.
        return sorted(new, key=lambda h: int(self.client.hget(self.keys[2], h).decode().split(":")[1]))


def test_a_burst_of_one_workflow_does_not_starve_another_at_the_same_priority(make_lane):
    width = 4
    lane = make_lane("pool:burst", width=width)
    drv = Driver(lane)
    held = [drv.acquire("A")[0] for _ in range(width)]
    for _ in range(996):
        assert drv.acquire("A")[1] == "queued"
    b_waiters = [drv.acquire("B")[0] for _ in range(10)]
    # Every holder works for one turn, oldest first, then releases.
    grants: list[str] = []
    while set(b_waiters) - set(grants):
        granted = drv.release(held.pop(0))
        grants += granted
        held += granted
        assert len(grants) < 1000, "B waited behind A's burst"
    tenth = grants.index(b_waiters[-1]) + 1
    share = max(1, width // 2)
    # B is owed `share` slots: it gets every other freed slot (A is owed the
    # rest), so its tenth waiter comes about 20 grants in, not after 996.
    assert tenth <= 10 * width // share + width, grants[:tenth]
    # FIFO within each workflow stays exact.
    a_grants = [g for g in grants if drv.workflow[g] == "A"]
    assert a_grants == sorted(a_grants, key=lambda g: int(g.split(".")[1]))
    assert [g for g in grants if drv.workflow[g] == "B"] == b_waiters
    stats = lane.stats()
    books = {(w.priority, w.workflow): w for w in stats.workflows}
    assert books[(U, "B")].waiting == 0 and books[(U, "A")].in_flight + books[(U, "B")].in_flight == width


def test_lent_slots_go_round_robin_between_two_deep_queues_and_an_owed_grant_does_not_reset_lending(make_lane):
    """The seed's own bug: one cursor for both passes sent every lent slot to
    the same deep queue, because each grant to the owed light workflow reset
    it. Width 3: a and b hold one each (their share, 3 // 2 or 3 // 3), the
    third slot goes to the light workflow c whenever c waits (owed), and is
    lent when c finishes."""
    lane = make_lane("pool:lend", width=3)
    drv = Driver(lane)
    drv.acquire("a", name="drv.a0")
    drv.acquire("b", name="drv.b0")
    last = drv.acquire("", I, name="drv.i0")[0]
    for k in range(1, 21):
        drv.acquire("a", name=f"drv.a{k}")
        drv.acquire("b", name=f"drv.b{k}")
    order = []
    for r in range(6):
        drv.acquire("c", name=f"drv.c{r}")
        assert drv.release(last) == [f"drv.c{r}"], "c holds nothing and waits: it is owed the slot"
        lent = drv.release(f"drv.c{r}")
        order += lent
        last = lent[0]
    assert order == ["drv.a1", "drv.b1", "drv.a2", "drv.b2", "drv.a3", "drv.b3"]


def test_priority_comes_before_any_share(make_lane):
    lane = make_lane("pool:prio", width=1)
    drv = Driver(lane)
    holder = drv.acquire("x", U)[0]
    for k in range(3):
        drv.acquire("starved", U, name=f"drv.u{k}")   # owed: holds nothing
    drv.acquire("other", I, name="drv.i")
    assert drv.release(holder) == ["drv.i"], "an interactive waiter first, whatever the user-tool shares"


def test_one_workflow_keeps_plain_arrival_order_and_its_books(make_lane):
    lane = make_lane("pool:one", width=1)
    drv = Driver(lane)
    holder = drv.acquire("solo")[0]
    waiters = [drv.acquire("solo")[0] for _ in range(5)]
    order = []
    for _ in waiters:
        granted = drv.release(holder)
        order += granted
        holder = granted[0]
    assert order == waiters
    drv.release(holder)
    assert lane.client.hgetall(lane.keys.all()[6]) == {}, "no share cursor moves with one workflow"
    assert int(lane.client.hget(lane.keys.meta, "h:1:solo")) == 0
    assert lane.client.zcard(lane.keys.all()[7]) == 0


def test_acquire_takes_the_workflow_and_a_burst_waits_its_share_behind_another(make_lane):
    lane = make_lane("pool:threads", width=1)
    holder = lane.acquire(U, 1.0, workflow="a")
    assert holder.workflow == "a"
    results: dict[str, object] = {}
    order: list[str] = []
    lock = threading.Lock()

    def wait(name: str, workflow: str) -> None:
        permit = lane.acquire(U, 10.0, workflow=workflow)
        with lock:
            order.append(name)
        results[name] = permit
        permit.release()

    threads = []
    for name, workflow in (("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b")):
        thread = threading.Thread(target=wait, args=(name, workflow), daemon=True)
        thread.start()
        threads.append(thread)
        queued = len(threads)
        for _ in range(500):
            if lane.stats().queued_total >= queued:
                break
            threading.Event().wait(0.005)
    stats = lane.stats()
    books = {(w.priority, w.workflow): w for w in stats.workflows}
    assert books[(U, "a")].in_flight == 1 and books[(U, "a")].waiting == 3 and books[(U, "a")].owed == 0
    assert books[(U, "b")].waiting == 1 and books[(U, "b")].owed == 1
    holder.release()
    for thread in threads:
        thread.join(10)
    # Width 1, two workflows: each is owed max(1, 1 // 2) = 1 slot; b's only
    # waiter comes second (after a1, the owed pass's first turn), not last.
    assert order == ["a1", "b1", "a2", "a3"]


def test_a_workflow_name_that_is_not_a_string_is_refused(make_lane):
    lane = make_lane("pool:bad", width=1)
    with pytest.raises(InvalidInput, match="workflow 42"):
        lane.acquire(U, 1.0, workflow=42)
    with pytest.raises(InvalidInput, match="at most 200"):
        lane.try_acquire(U, workflow="w" * 201)

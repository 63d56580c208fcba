"""A hypothesis state machine: the lane's scripts against a pure-Python model.

Waiters belong to workflows ('' anonymous, 'a', 'b'): the model serves a
freed slot by priority first, then by the guaranteed share per workflow
(issue 14: an owed workflow first, round-robin; otherwise lent round-robin,
each pass with its own cursor), then arrival order within the workflow.

The machine drives the scripts directly (waiters are synthetic ids, their
doorbells are read from a subscribed channel), so every interleaving of
acquire / release / cancel / timeout / resize / expiry is explored without
threads. Leases are long (60 s) so nothing expires unless a rule says so;
"expiry" moves a holder's lease deadline into the past, as a crash would.
An urgent waiter queued on a full lane asks background holders to yield
(lib_yield.lua): the model names which, those granted 20 ms ago or earlier
before younger ones, newest grant first within each, one per urgent waiter
not yet covered by an ask, and the asks heard must be exactly those. Each
grant's time is pinned (see ``pin_age``) so that which holders count as young
never depends on how fast the machine runs an example's steps.
"""

from __future__ import annotations

import itertools

import pytest
import redis
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from lanes.lane._lua import scripts_for
from lanes.lane.keys import LaneKeys

LEASE_MS = 60_000
CHANNEL = "lanes:test:wake:model"


WORKFLOWS = ("", "a", "b")


def member(wid: str, workflow: str = "") -> str:
    """A waiter's queue record (notify 0, no wait limit, the model's lease), as acquire.lua writes it."""
    record = f"0:-1:{LEASE_MS}:{wid}"
    return f"{record}:{workflow}" if workflow else record


def _after(names: list[str], last: str | None) -> str:
    return next((name for name in names if last is None or name > last), names[0])


class Model:
    """What the lane must do, with no Redis: width, holders, a priority queue,
    and the share per workflow within a priority."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.holders: dict[str, tuple[int, str]] = {}   # id -> (priority, workflow)
        self.queue: list[tuple[int, int, str, str]] = []  # (priority, arrival, id, workflow)
        self.arrivals = itertools.count()
        self.owed_cursor: dict[int, str] = {}
        self.lend_cursor: dict[int, str] = {}
        self.grants = itertools.count()
        self.granted: dict[str, int] = {}  # holder id -> grant order (the script's counter order)
        self.asked: set[str] = set()       # background holders asked to yield
        self.young: set[str] = set()       # holders granted less than 20 ms ago (LaneMachine.pin_age)

    def hold(self, wid: str, priority: int, workflow: str) -> None:
        self.holders[wid] = (priority, workflow)
        self.granted[wid] = next(self.grants)

    def unhold(self, wid: str) -> None:
        self.holders.pop(wid, None)
        self.asked.discard(wid)
        self.young.discard(wid)

    def ask_yields(self) -> list[str]:
        urgent = sum(1 for entry in self.queue if entry[0] < 2)
        background = [wid for wid, (prio, _) in self.holders.items() if prio == 2]
        want = urgent - sum(1 for wid in background if wid in self.asked)
        free = sorted((wid for wid in background if wid not in self.asked),
                      key=lambda wid: (wid in self.young, -self.granted[wid]))
        asked = free[:max(0, want)]
        self.asked.update(asked)
        return asked

    def workflow_of(self, wid: str) -> str:
        if wid in self.holders:
            return self.holders[wid][1]
        return next(e[3] for e in self.queue if e[2] == wid)

    def next_waiter(self) -> tuple:
        self.queue.sort()
        head = self.queue[0]
        p = head[0]
        waiting = sorted({e[3] for e in self.queue if e[0] == p})
        if len(waiting) < 2:
            return head
        held: dict[str, int] = {}
        for prio, wf in self.holders.values():
            if prio == p:
                held[wf] = held.get(wf, 0) + 1
        with_work = set(waiting) | set(held)
        share = max(1, self.width // len(with_work))
        owed = [wf for wf in waiting if held.get(wf, 0) < share]
        if owed:
            wf = self.owed_cursor[p] = _after(owed, self.owed_cursor.get(p))
        else:
            wf = self.lend_cursor[p] = _after(waiting, self.lend_cursor.get(p))
        return next(e for e in self.queue if e[0] == p and e[3] == wf)

    def fill(self) -> list[str]:
        granted = []
        while len(self.holders) < self.width and self.queue:
            entry = self.next_waiter()
            self.queue.remove(entry)
            self.hold(entry[2], entry[0], entry[3])
            granted.append(entry[2])
        return granted

    def acquire(self, wid: str, priority: int, workflow: str) -> tuple[str, list[str]]:
        if len(self.holders) < self.width and not self.queue:
            self.hold(wid, priority, workflow)
            return "granted", []
        self.queue.append((priority, next(self.arrivals), wid, workflow))
        return "queued", self.ask_yields() if priority < 2 else []

    def release(self, wid: str) -> list[str]:
        self.unhold(wid)
        return self.fill()

    def leave(self, wid: str) -> tuple[str, list[str]]:
        for entry in self.queue:
            if entry[2] == wid:
                self.queue.remove(entry)
                return "left", []
        if wid in self.holders:
            self.unhold(wid)
            return "returned", self.fill()
        return "gone", []

    def books(self) -> dict[str, int]:
        """The holder counts as meta keeps them, h:<priority>:<workflow> (zero counts left out)."""
        out: dict[str, int] = {}
        for prio, wf in self.holders.values():
            out[f"h:{prio}:{wf}"] = out.get(f"h:{prio}:{wf}", 0) + 1
        return out


class LaneMachine(RuleBasedStateMachine):
    url: str = ""

    @initialize(width=st.integers(min_value=0, max_value=3))
    def setup(self, width):
        self.client = redis.Redis.from_url(self.url, decode_responses=True)
        self.client.flushdb()
        self.keys = LaneKeys("lanes:test", "pool:model").all()
        self.scripts = scripts_for(self.client)
        self.pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(CHANNEL)
        self.pubsub.get_message(timeout=1.0)  # confirmation
        self.scripts["provision"](keys=self.keys, args=[width, ""])  # run '' = unknown (lib_base.lua)
        self.model = Model(width)
        self.ids = itertools.count()
        self.generations: dict[str, tuple[int, int]] = {}
        self.last_generation = (0, 0)
        self.max_width_since = width

    def teardown(self):
        if hasattr(self, "pubsub"):
            self.pubsub.close()
            self.client.close()

    def run(self, name, args):
        return self.scripts[name](keys=self.keys, args=[*args, ""])  # run '' = unknown (lib_base.lua)

    def doorbells(self, asks: list | None = None) -> list[str]:
        # Doorbells published by a script are delivered before a message
        # published after it: read up to our own sentinel, no sleeping.
        # An ask to yield is a holder id alone: collected in ``asks``, and
        # allowed only where the caller expects asks.
        self.client.publish(CHANNEL, "end")
        rung = []
        while True:
            message = self.pubsub.get_message(timeout=2.0)
            assert message is not None, "the sentinel did not arrive"
            if message["type"] == "message":
                if message["data"] == "end":
                    return rung
                parts = message["data"].split(" ")
                if len(parts) == 1:
                    assert asks is not None, f"an ask to yield {parts[0]} where none was due"
                    asks.append(parts[0])
                    continue
                wid, epoch, counter = parts
                self.note_generation(wid, int(epoch), int(counter))
                rung.append(wid)

    def note_generation(self, wid, epoch, counter):
        generation = (epoch, counter)
        assert generation > self.last_generation, "generations strictly increase"
        self.last_generation = generation
        self.generations[wid] = generation
        self.pin_age(wid, counter)

    def pin_age(self, wid: str, counter: int) -> None:
        """An urgent waiter asks holders granted 20 ms ago or earlier first
        (lib_yield.lua). With real grant times that would turn on how long
        the machine took over the steps since, so each grant's time is
        rewritten: an odd counter's an hour back (a call under way), an even
        one's an hour ahead (young however long the example runs)."""
        epoch, grant_counter, _, rest = self.client.hget(self.keys[2], wid).split(":", 3)
        now_ms = int(self.client.time()[0]) * 1000
        young = counter % 2 == 0
        granted = now_ms + 3_600_000 if young else now_ms - 3_600_000
        self.client.hset(self.keys[2], wid, f"{epoch}:{grant_counter}:{granted}:{rest}")
        if young:
            self.model.young.add(wid)

    @rule(priority=st.integers(min_value=0, max_value=2), workflow=st.sampled_from(WORKFLOWS))
    def acquire(self, priority, workflow):
        # "model.<n>": the scripts wake ids of token "model" on CHANNEL.
        wid = f"model.{next(self.ids)}"
        reply = self.run("acquire", [wid, priority, -1, LEASE_MS, "", "0", "0", "1", "", workflow])
        expected, asks = self.model.acquire(wid, priority, workflow)
        assert reply[0] == expected
        if expected == "granted":
            self.note_generation(wid, int(reply[1]), int(reply[2]))
        heard: list[str] = []
        assert self.doorbells(heard) == []
        assert heard == asks, "urgent work asks the newest background holders, one per urgent waiter"
        if expected == "queued":
            assert list(reply[3:]) == asks, "the reply names the holders asked, as the doorbells do"


    @rule(priority=st.integers(min_value=0, max_value=1), workflow=st.sampled_from(WORKFLOWS),
          count=st.integers(min_value=2, max_value=4))
    def burst(self, priority, workflow, count):
        # Several arrivals of one workflow at once: deep queues of two or more
        # workflows at one priority, where shares and both cursors decide.
        for _ in range(count):
            self.acquire(priority, workflow)

    @rule(data=st.data())
    @precondition(lambda self: self.model.holders)
    def release(self, data):
        wid = data.draw(st.sampled_from(sorted(self.model.holders)))
        epoch, counter = self.generations[wid]
        # own: the caller takes a grant to a waiter of its own token (every
        # id here is "model.<n>") from the reply, and no doorbell rings for it.
        own = data.draw(st.booleans(), label="own")
        reply = self.run("release", [wid, epoch, counter, LEASE_MS, 1 if own else 0])
        assert reply[0] == 1
        rung = self.doorbells()
        granted = self.model.release(wid)
        if len(reply) > 2:  # a lean handoff names its grant
            assert [reply[2]] == granted, "handoff goes to the waiter the model names"
            if own:
                assert reply[5] == 0 and rung == [], "told by the reply alone"
                self.note_generation(reply[2], int(reply[3]), int(reply[4]))
            else:
                assert reply[5] == 1 and rung == [reply[2]], "its doorbell rang"
                assert self.generations[reply[2]] == (int(reply[3]), int(reply[4]))
        else:
            assert rung == granted, "handoff goes to the waiters the model names, in order"

    @rule(data=st.data())
    @precondition(lambda self: self.generations)
    def stale_release(self, data):
        wid = data.draw(st.sampled_from(sorted(self.generations)))
        epoch, counter = self.generations[wid]
        before = self.client.zcard(self.keys[1])
        reply = self.run("release", [wid, epoch, counter - 1, LEASE_MS, 1])
        assert reply[0] == 0 and self.client.zcard(self.keys[1]) == before

    @rule(data=st.data(), reason=st.sampled_from(["timeouts", "cancels"]))
    @precondition(lambda self: self.model.queue or self.model.holders)
    def leave(self, data, reason):
        # A waiter gives up: queued ones leave; one granted "in the same instant"
        # (a holder that never saw its doorbell) gives the slot back.
        candidates = sorted([e[2] for e in self.model.queue] + sorted(self.model.holders))
        wid = data.draw(st.sampled_from(candidates))
        reply = self.run("leave", [member(wid, self.model.workflow_of(wid)), reason, LEASE_MS])
        expected, granted = self.model.leave(wid)
        assert reply == expected
        assert self.doorbells() == granted

    @rule(width=st.integers(min_value=0, max_value=4))
    def resize(self, width):
        old, more = self.run("resize", [width, LEASE_MS])
        assert old == self.model.width and more == 0
        self.model.width = width
        self.max_width_since = width if len(self.model.holders) <= width else self.max_width_since
        assert self.doorbells() == self.model.fill()

    @rule(data=st.data())
    @precondition(lambda self: self.model.holders)
    def expire(self, data):
        # The holder crashed and its lease ran out: the next call reaps it.
        wid = data.draw(st.sampled_from(sorted(self.model.holders)))
        self.client.zadd(self.keys[1], {wid: 1})
        reply = self.run("renew", [LEASE_MS, ""])
        self.model.unhold(wid)
        assert self.doorbells() == self.model.fill()
        assert reply[0] == str(self.last_generation[0])

    @rule(data=st.data())
    @precondition(lambda self: self.model.holders)
    def renew_after_expiry_is_refused(self, data):
        wid = data.draw(st.sampled_from(sorted(self.model.holders)))
        epoch, counter = self.generations[wid]
        prio, workflow = self.model.holders[wid]
        codes = self.run("renew", [LEASE_MS, "", "h", wid, epoch, counter, prio, workflow])[3:]
        assert codes == ["ok"]

    @rule(data=st.data())
    @precondition(lambda self: self.model.queue or self.model.holders)
    def waiter_renews(self, data):
        # A waiter's renewal keeps its place, or finds its grant (a doorbell
        # it never read) in the lane.
        candidates = sorted([e[2] for e in self.model.queue] + sorted(self.model.holders))
        wid = data.draw(st.sampled_from(candidates))
        reply = self.run("renew", [LEASE_MS, "", "w", member(wid, self.model.workflow_of(wid)), 0, 0, 0, ""])
        if wid in self.model.holders:
            assert reply[3] == "g:%d:%d" % self.generations[wid]
        else:
            assert reply[3] == "q"
        assert self.doorbells() == []

    @invariant()
    def matches_the_model(self):
        if not hasattr(self, "model"):
            return
        holders = set(self.client.zrange(self.keys[1], 0, -1))
        queue = self.client.zrange(self.keys[3], 0, -1)
        assert holders == set(self.model.holders)
        assert queue == [member(e[2], e[3]) for e in sorted(self.model.queue)]
        books = {k: int(v) for k, v in self.client.hgetall(self.keys[0]).items() if k.startswith("h:") and int(v)}
        assert books == self.model.books(), "meta counts every holder by priority and workflow"
        marks = {k[2:] for k in self.client.hkeys(self.keys[0]) if k.startswith("y:")}
        assert marks == self.model.asked, "a holder asked to yield is marked until it goes"
        # Once a second workflow has queued, every waiter has its workflow queue entry; before, none.
        multi = self.client.hget(self.keys[0], "multi") == "1"
        assert self.client.zcard(self.keys[7]) == (len(queue) if multi else 0)
        assert set(self.client.zrange(self.keys[4], 0, -1)) == set(queue), "every waiter has a lease entry"
        assert int(self.client.hget(self.keys[0], "inflight")) == len(holders), "meta's inflight is ZCARD holders"
        # Never more than W, except holders admitted before a shrink (they drain).
        assert len(holders) <= max(self.model.width, self.max_width_since)
        if len(holders) <= self.model.width:
            self.max_width_since = self.model.width


# On both Redis servers in the full tier; the fast tier checks the model on the
# embedded 6.2 (the machine's Redis 7 runs the same Lua in the fast tier's lane tests).
# The lane's invariants belong in every pre-commit run: 60 examples of up to 50 steps
# take 7-11 s on 2 cores, past the tier's 8 s, so the test names its own limit.
@pytest.mark.tier_limit(25)
@pytest.mark.parametrize(
    "redis_url", ["embedded", pytest.param("machine", marks=pytest.mark.slow)], indirect=True
)
def test_the_lane_matches_its_model(redis_url):
    LaneMachine.url = redis_url
    LaneMachine.TestCase().runTest()

"""The worker memory gate (seed 000's tests), on a readable source and on cgroup files."""

from __future__ import annotations

from pathlib import Path

from workers.memgate import MemoryGate, MemoryGateWatcher, cgroup_memory


class Source:
    def __init__(self, ratio: float | None) -> None:
        self.ratio = ratio

    def __call__(self) -> float | None:
        return self.ratio


def gate(ratio=0.5, high=0.9, low=0.7):
    source = Source(ratio)
    return MemoryGate(high, low, read=source), source


def test_open_below_the_high_mark():
    g, _ = gate(0.89)
    assert g.update(10) is True and not g.state.engaged


def test_engages_at_the_high_mark_and_records_the_in_flight_count():
    g, _ = gate(0.9)
    assert g.update(37) is False
    assert g.state.engaged and g.state.in_flight_at_gate == 37 and g.state.engagements == 1


def test_stays_engaged_between_the_marks_and_releases_below_the_low_one():
    g, source = gate(0.95)
    g.update(20)
    source.ratio = 0.8
    assert g.update(19) is False
    source.ratio = 0.69
    assert g.update(19) is True


def test_releases_once_in_flight_drained_to_a_fraction_of_its_level_at_engagement():
    g, source = gate(0.95)
    g.update(20)
    source.ratio = 0.93  # memory the runtime keeps does not come back
    assert g.update(11) is False
    assert g.update(10) is True


def test_an_idle_worker_above_the_high_mark_stays_gated_until_memory_falls():
    # Nothing in flight at engagement: there is nothing to drain, so only the low mark releases.
    g, source = gate(0.95)
    assert g.update(0) is False
    assert g.update(0) is False and g.state.engagements == 1
    source.ratio = 0.69
    assert g.update(0) is True


def test_an_unreadable_source_never_blocks():
    g, source = gate(0.95)
    g.update(20)
    source.ratio = None
    assert g.update(20) is True


def test_nonsensical_thresholds_give_no_gate():
    for high, low in ((None, None), (1.5, 0.5), (0.8, 0.9), (0.0, None), (0.8, 0.8)):
        g = MemoryGate(high, low, read=Source(1.0))
        assert not g.enabled and g.update(100) is True


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_cgroup_v2_is_read_without_reclaimable_cache(tmp_path):
    root = write(tmp_path, {"memory.current": "800\n", "memory.max": "1000\n", "memory.stat": "anon 1\ninactive_file 300\n"})
    assert cgroup_memory(root) == 0.5


def test_cgroup_v1_is_the_fallback_and_no_limit_is_unknown(tmp_path):
    root = write(tmp_path, {"memory/memory.usage_in_bytes": "900", "memory/memory.limit_in_bytes": "1000",
                            "memory/memory.stat": "total_inactive_file 100\n"})
    assert cgroup_memory(root) == 0.8
    unlimited = write(tmp_path / "u", {"memory.current": "5", "memory.max": "max"})
    assert cgroup_memory(unlimited) is None
    assert cgroup_memory(tmp_path / "nothing") is None


class LoopConsumer:
    """Stands in for Celery's consumer loop only: it runs posted callbacks
    when told, in the order given, as kombu's hub may."""

    def __init__(self) -> None:
        self.posted = []
        self.consuming = {"lanes.p"}

    class _TaskConsumer:
        def __init__(self, names) -> None:
            self.queues = [type("Q", (), {"name": n})() for n in names]

    @property
    def task_consumer(self):
        return self._TaskConsumer(["lanes.p"])

    def call_soon(self, fn, *args) -> None:
        self.posted.append((fn, args))

    def add_task_queue(self, name) -> None:
        self.consuming.add(name)

    def cancel_task_queue(self, name) -> None:
        self.consuming.discard(name)


def test_a_pause_and_a_resume_posted_together_end_in_the_latest_wish_whatever_order_they_run():
    g, source = gate(0.95)
    watcher = MemoryGateWatcher(g, [], in_flight=lambda: 4)
    consumer = LoopConsumer()
    watcher.attach(consumer)
    watcher.poll()  # engages: a pause is posted
    source.ratio = 0.1
    watcher.poll()  # releases: a resume is posted before the pause ran
    for fn, args in reversed(consumer.posted):  # the loop runs them the other way round
        fn(*args)
    assert consumer.consuming == {"lanes.p"}

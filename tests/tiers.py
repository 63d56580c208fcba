"""The test tiers: a fast tier for every commit, the full suite for CI.

    python -m pytest --fast-tier            # skip tests marked ``slow``; check their times
    python -m pytest --fast-tier --fast-tier-limit 3
    python -m pytest -m slow                # the rest of the suite

``--fast-tier`` deselects every test marked ``slow`` and times each one that
runs: its setup, call and teardown, less the set-up and tear-down of module,
class, package and session fixtures (a worker one module's tests share is paid
once, by whichever test comes first; it is listed apart, as information). At
the end a report lists the tests that took longer than the limit (the
``fast_tier_limit`` ini value, 8 s in pyproject.toml and 5 s without it, or
``--fast-tier-limit``). Such a test still passes; the run's exit status becomes ``TIMING_FAILED`` (6)
so the tier's own check fails and says which test to mark ``slow`` or make
faster. A failing test keeps pytest's own status (1): failures come first.

A feature's one end-to-end path in the fast tier (``@pytest.mark.end_to_end``)
starts real workers, which no unit test's limit allows for: it is held to
``END_TO_END_LIMIT`` seconds instead (or the marker's ``limit=``). Another test
the fast tier must keep though it runs longer (the lane's model-based check)
names its own limit: ``@pytest.mark.tier_limit(20)``.

Loaded by tests/conftest.py; a timing that only the full tier sees is never
checked (without ``--fast-tier`` the plugin does nothing).
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

TIMING_FAILED = 6
DEFAULT_LIMIT = 5.0
END_TO_END_LIMIT = 30.0


def pytest_addoption(parser) -> None:
    group = parser.getgroup("tiers", "test tiers")
    group.addoption(
        "--fast-tier",
        action="store_true",
        help="run the fast tier: skip tests marked slow, report those over the limit",
    )
    group.addoption(
        "--fast-tier-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="a fast-tier test over this many seconds fails the timing check "
        "(default: the fast_tier_limit ini value)",
    )
    parser.addini(
        "fast_tier_limit",
        "seconds a fast-tier test may take before the timing check fails",
        default=str(DEFAULT_LIMIT),
    )


def _limit(config) -> float:
    value = config.getoption("--fast-tier-limit")
    source = "--fast-tier-limit"
    if value is None:
        raw, source = config.getini("fast_tier_limit"), "fast_tier_limit (ini)"
        try:
            value = float(raw)
        except ValueError:
            raise pytest.UsageError(f"{source} is {raw!r}; give a number of seconds, e.g. 5") from None
    if value <= 0:
        raise pytest.UsageError(f"{source} is {value!r}; give a positive number of seconds, e.g. 5")
    return value


class FastTier:
    """Deselects the slow tests and keeps each remaining test's own time."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.limits: dict[str, float] = {}                     # nodeid -> its own limit (end_to_end)
        self.seconds: dict[str, float] = defaultdict(float)
        self.shared: dict[str, float] = defaultdict(float)   # "name (scope) of nodeid" -> s
        self._current = ""                                     # the test now running
        self._shared_depth = 0                                 # nested shared set-ups
        self._finishing: dict[int, float] = {}                 # id(fixturedef) -> start

    @property
    def over(self) -> list[tuple[str, float]]:
        slow = [(nodeid, s) for nodeid, s in self.seconds.items() if s > self.limits.get(nodeid, self.limit)]
        return sorted(slow, key=lambda item: -item[1])

    def pytest_collection_modifyitems(self, config, items) -> None:
        keep, drop = [], []
        for item in items:
            (drop if item.get_closest_marker("slow") else keep).append(item)
            path = item.get_closest_marker("end_to_end")
            if path is not None:
                self.limits[item.nodeid] = float(path.kwargs.get("limit", END_TO_END_LIMIT))
            own = item.get_closest_marker("tier_limit")
            if own is not None:
                self.limits[item.nodeid] = float(own.args[0])
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def pytest_runtest_logstart(self, nodeid) -> None:
        self._current = nodeid

    def _charge_shared(self, fixturedef, request, seconds: float) -> None:
        self.shared[f"{fixturedef.argname} ({fixturedef.scope}) of {request.node.nodeid or '.'}"] += seconds
        if self._current:
            self.seconds[self._current] -= seconds   # taken back from the test that paid it

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        if fixturedef.scope == "function":
            yield
            return
        self._shared_depth += 1
        start = time.perf_counter()
        yield
        self._shared_depth -= 1
        if self._shared_depth == 0:   # an outer shared fixture's time already includes this one
            self._charge_shared(fixturedef, request, time.perf_counter() - start)
        # Finalizers run last-in first-out: this one runs just before the fixture's own teardown.
        fixturedef.addfinalizer(lambda: self._finishing.__setitem__(id(fixturedef), time.perf_counter()))

    def pytest_fixture_post_finalizer(self, fixturedef, request) -> None:
        start = self._finishing.pop(id(fixturedef), None)
        if start is not None:
            self._charge_shared(fixturedef, request, time.perf_counter() - start)

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[report.nodeid] += report.duration

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        # Only a run whose tests all passed turns into a timing failure.
        if exitstatus == pytest.ExitCode.OK and self.over:
            session.exitstatus = TIMING_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        total = sum(self.seconds.values()) + sum(self.shared.values())
        write = terminalreporter.write_line
        terminalreporter.write_sep(
            "=", f"fast tier: {len(self.seconds)} tests, {total:.1f} s of test time, limit {self.limit:g} s"
        )
        shared = sorted(((s, name) for name, s in self.shared.items() if s > self.limit), reverse=True)
        if shared:
            write("shared fixtures over the limit (paid once each, not counted against a test):")
            for seconds, name in shared:
                write(f"{seconds:8.2f}s  {name}")
        over = self.over
        if not over:
            write("timing check passed: no test over the limit")
            return
        write("tests over the limit:")
        for nodeid, seconds in over:
            write(f"{seconds:8.2f}s  {nodeid} (limit {self.limits.get(nodeid, self.limit):g} s)")
        write(
            f"timing check FAILED: {len(over)} test(s) over their limit (the tier's: {self.limit:g} s); mark them "
            f"@pytest.mark.slow (the full tier) or make them faster "
            f"(exit status {TIMING_FAILED} when every test passed)"
        )


def pytest_configure(config) -> None:
    if config.getoption("--fast-tier"):
        config.pluginmanager.register(FastTier(_limit(config)), "fast-tier")

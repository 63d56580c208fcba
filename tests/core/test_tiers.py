"""The fast tier's plugin (tests/tiers.py), run by pytest on a tiny sample suite.

The sample's "slow to run" test sleeps longer than the limit it is given, so it
is over the limit on any machine; the quick ones do nothing, far under it.
"""

from __future__ import annotations

import pytest

from tests.tiers import TIMING_FAILED

SAMPLE = """
import time
import pytest

def test_quick():
    pass

def test_sleeps_past_the_limit():
    time.sleep(1.0)

@pytest.mark.slow
def test_marked_slow():
    pass
"""

INI = """
[pytest]
asyncio_default_fixture_loop_scope = function
markers =
    slow: the full tier only
    end_to_end: a feature's end-to-end path
    tier_limit: a test's own limit
"""


@pytest.fixture
def sample(pytester):
    pytester.makeini(INI)
    pytester.makepyfile(test_sample=SAMPLE)
    return pytester


def test_the_fast_tier_skips_slow_tests_and_lists_one_over_the_limit_without_failing_it(sample):
    result = sample.runpytest("-p", "tests.tiers", "--fast-tier", "--fast-tier-limit", "0.8")

    result.assert_outcomes(passed=2, deselected=1)
    assert result.ret == TIMING_FAILED
    result.stdout.fnmatch_lines([
        "*fast tier: 2 tests*limit 0.8 s*",
        "*s  test_sample.py::test_sleeps_past_the_limit (limit 0.8 s)",
        "*timing check FAILED: 1 test(s) over their limit (the tier's: 0.8 s)*",
    ])
    assert "test_quick" not in result.stdout.str().split("fast tier:")[1]


def test_under_the_limit_the_check_passes_and_the_run_exits_zero(sample):
    result = sample.runpytest("-p", "tests.tiers", "--fast-tier", "--fast-tier-limit", "600")

    result.assert_outcomes(passed=2, deselected=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*timing check passed: no test over the limit*"])


END_TO_END = """
import time
import pytest

@pytest.mark.end_to_end(limit=5)
def test_a_features_path():
    time.sleep(1.0)

@pytest.mark.end_to_end(limit=0.5)
def test_a_path_past_its_own_limit():
    time.sleep(1.0)
"""


def test_an_end_to_end_path_is_held_to_its_own_limit_not_the_tiers(pytester):
    pytester.makeini(INI)
    pytester.makepyfile(test_paths=END_TO_END)
    result = pytester.runpytest("-p", "tests.tiers", "--fast-tier", "--fast-tier-limit", "0.8")

    result.assert_outcomes(passed=2)
    assert result.ret == TIMING_FAILED
    result.stdout.fnmatch_lines([
        "*s  test_paths.py::test_a_path_past_its_own_limit (limit 0.5 s)",
        "*timing check FAILED: 1 test(s) over their limit (the tier's: 0.8 s)*",
    ])
    assert "test_a_features_path" not in result.stdout.str().split("fast tier:")[1]


OWN_LIMIT = """
import time
import pytest

@pytest.mark.tier_limit(5)
def test_a_long_invariant_check():
    time.sleep(1.0)

@pytest.mark.tier_limit(0.5)
def test_one_past_its_own_limit():
    time.sleep(1.0)
"""


def test_a_test_with_a_limit_of_its_own_is_held_to_it_not_the_tiers(pytester):
    pytester.makeini(INI)
    pytester.makepyfile(test_own=OWN_LIMIT)
    result = pytester.runpytest("-p", "tests.tiers", "--fast-tier", "--fast-tier-limit", "0.8")

    result.assert_outcomes(passed=2)
    assert result.ret == TIMING_FAILED
    result.stdout.fnmatch_lines(["*s  test_own.py::test_one_past_its_own_limit (limit 0.5 s)"])
    assert "test_a_long_invariant_check" not in result.stdout.str().split("fast tier:")[1]


def test_the_limit_comes_from_the_ini_file_when_not_given(sample):
    sample.makeini(INI + "fast_tier_limit = 0.8\n")

    result = sample.runpytest("-p", "tests.tiers", "--fast-tier")

    assert result.ret == TIMING_FAILED
    result.stdout.fnmatch_lines(["*limit 0.8 s*", "*s  test_sample.py::test_sleeps_past_the_limit (limit 0.8 s)"])


def test_a_failing_test_keeps_pytests_own_status_and_the_report_still_lists_the_slow_one(sample):
    sample.makepyfile(test_broken="def test_broken():\n    assert False\n")

    result = sample.runpytest("-p", "tests.tiers", "--fast-tier", "--fast-tier-limit", "0.8")

    result.assert_outcomes(passed=2, failed=1, deselected=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*s  test_sample.py::test_sleeps_past_the_limit (limit 0.8 s)"])


SHARED = """
import time
import pytest

@pytest.fixture(scope="module")
def worker():
    time.sleep(1.0)
    yield "up"
    time.sleep(1.0)

def test_first(worker):
    assert worker == "up"

def test_second(worker):
    assert worker == "up"
"""


def test_a_module_fixtures_set_up_and_tear_down_are_listed_apart_not_charged_to_a_test(pytester):
    pytester.makeini(INI)
    pytester.makepyfile(test_shared=SHARED)

    result = pytester.runpytest("-p", "tests.tiers", "--fast-tier", "--fast-tier-limit", "0.9")

    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "*shared fixtures over the limit*",
        "*s  worker (module) of test_shared.py",
        "*timing check passed*",
    ])


def test_without_the_flag_every_test_runs_and_nothing_is_timed(sample):
    result = sample.runpytest("-p", "tests.tiers")

    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.OK
    assert "fast tier" not in result.stdout.str()


@pytest.mark.parametrize("limit", ["0", "-3", "soon"])
def test_a_limit_that_is_not_a_positive_number_is_refused_by_name(sample, limit):
    sample.makeini(INI + f"fast_tier_limit = {limit}\n")

    result = sample.runpytest("-p", "tests.tiers", "--fast-tier")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*fast_tier_limit (ini) is*{limit}*give a*number of seconds*"])


# --- dev.py test: which tier a command line runs --------------------------------


def _dev():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "dev.py"
    spec = importlib.util.spec_from_file_location("lanes_dev_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("given", "runs"),
    [
        ([], ["--fast-tier"]),
        (["-x", "-q"], ["--fast-tier", "-x", "-q"]),
        (["-k", "lane"], ["--fast-tier", "-k", "lane"]),
        (["--all"], []),
        (["--all", "-x"], ["-x"]),
        (["tests/e2e/test_chaos.py"], ["tests/e2e/test_chaos.py"]),
        (["tests/lane/test_lane.py::test_x", "-q"], ["tests/lane/test_lane.py::test_x", "-q"]),
        (["-p", "tests.green", "tests/lane"], ["-p", "tests.green", "tests/lane"]),
        (["-m", "slow"], ["-m", "slow"]),
        (["-mslow"], ["-mslow"]),
        (["--fast-tier", "--fast-tier-limit", "8"], ["--fast-tier", "--fast-tier-limit", "8"]),
    ],
)
def test_dev_test_runs_the_fast_tier_unless_told_all_a_path_or_a_marker(given, runs, capsys):
    assert _dev().test_arguments(given) == runs


@pytest.mark.slow  # a few seconds of waiting; the fast tier keeps to its 8 minutes
def test_a_second_backends_run_of_a_test_is_in_the_slow_tier_and_the_defaults_run_is_not():
    # The project's own conftest, on a real test file parametrized over both Redis servers.
    import subprocess
    import sys
    from pathlib import Path

    ROOT = Path(__file__).resolve().parents[2]

    def collected(*options: str) -> set[str]:
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
                               *options, "tests/lane/test_model.py"],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        return {line for line in done.stdout.splitlines() if "::" in line}

    fast, slow = collected("--fast-tier"), collected("-m", "slow")
    assert any(node.endswith("[embedded]") for node in fast)
    assert not any(node.endswith("[machine]") for node in fast)
    assert any(node.endswith("[machine]") for node in slow)
    assert not any(node.endswith("[embedded]") for node in slow)

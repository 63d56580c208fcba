"""Breakers against a real Redis: shared state, consecutive and rate opening, half-open trials."""

import time

import redis

from lanes.routing.breaker import BreakerPolicy, Breakers


def make(url, **policy):
    client = redis.Redis.from_url(url)
    return Breakers(client, prefix="lanes:test", policy=BreakerPolicy(**policy))


def test_a_closed_breaker_allows_calls(redis_url):
    breakers = make(redis_url)
    assert breakers.state("m") == "closed"
    assert breakers.allows("m")


def test_consecutive_failures_open_the_breaker_and_another_process_sees_it(redis_url):
    ours, theirs = make(redis_url, consecutive=3), make(redis_url, consecutive=3)
    assert ours.record("m", ok=False) == "closed"
    assert ours.record("m", ok=False) == "closed"
    assert ours.record("m", ok=False) == "open"
    assert theirs.state("m") == "open"
    assert theirs.state("other") == "closed"


def test_a_success_resets_the_consecutive_count(redis_url):
    breakers = make(redis_url, consecutive=3, min_samples=100)
    for ok in (False, False, True, False, False):
        breakers.record("m", ok=ok)
    assert breakers.state("m") == "closed"


def test_a_failure_rate_over_the_window_opens_the_breaker(redis_url):
    breakers = make(redis_url, consecutive=100, window=10, min_samples=10, failure_rate=0.5)
    states = [breakers.record("m", ok=ok) for ok in [True, False] * 4 + [True]]
    assert set(states) == {"closed"}  # 4 failures in 9: below the minimum sample count
    assert breakers.record("m", ok=False) == "open"  # 5 in 10


def test_the_window_forgets_old_failures(redis_url):
    breakers = make(redis_url, consecutive=100, window=4, min_samples=4, failure_rate=0.75)
    for ok in (False, False, True, True, True, True):
        breakers.record("m", ok=ok)
    # The two early failures have left the window: one failure in the last four.
    assert breakers.record("m", ok=False) == "closed"


def test_after_the_cooldown_one_trial_goes_through_and_its_outcome_decides(redis_url):
    breakers = make(redis_url, consecutive=1, cooldown_seconds=0.2, trial_seconds=5)
    breakers.record("m", ok=False)
    assert breakers.state("m") == "open"
    time.sleep(0.25)
    assert breakers.state("m") == "half_open"
    assert breakers.state("m") == "open"  # only one trial at a time
    assert breakers.record("m", ok=True) == "closed"
    assert breakers.state("m") == "closed"


def test_a_failed_trial_reopens_for_another_cooldown(redis_url):
    breakers = make(redis_url, consecutive=1, cooldown_seconds=0.2)
    breakers.record("m", ok=False)
    time.sleep(0.25)
    assert breakers.state("m") == "half_open"
    assert breakers.record("m", ok=False) == "open"
    assert breakers.state("m") == "open"

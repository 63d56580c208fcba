"""Breakers against a real Redis: shared state, consecutive and rate opening, half-open trials."""

import time

import pytest
import redis

from lanes import RedisUnavailable
from lanes.routing.breaker import BreakerPolicy, Breakers, Claim
from tests.polling import eventually


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


def cooled_down(breakers, model="m"):
    return eventually(lambda: breakers.state(model) == "half_open", what="the cool-down to end")


def test_after_the_cooldown_one_trial_goes_through_and_its_outcome_decides(redis_url):
    breakers = make(redis_url, consecutive=1, cooldown_seconds=0.2, trial_seconds=5)
    breakers.record("m", ok=False)
    assert breakers.state("m") == "open"
    assert breakers.claim("m").state == "open"
    cooled_down(breakers)
    assert breakers.state("m") == "half_open"  # looking takes nothing
    first = breakers.claim("m")
    assert first.state == "trial" and first.trial
    assert breakers.claim("m").state == "open"  # only one trial at a time
    assert breakers.state("m") == "open"
    assert breakers.record("m", ok=True) == "closed"
    assert breakers.state("m") == "closed"
    assert breakers.claim("m") == Claim("closed")


def test_a_failed_trial_reopens_for_another_cooldown(redis_url):
    breakers = make(redis_url, consecutive=1, cooldown_seconds=0.2)
    breakers.record("m", ok=False)
    cooled_down(breakers)
    assert breakers.claim("m").state == "trial"
    assert breakers.record("m", ok=False) == "open"
    assert breakers.state("m") == "open"


def test_looking_at_a_half_open_breaker_never_takes_its_trial(redis_url):
    breakers = make(redis_url, consecutive=1, cooldown_seconds=0.2)
    breakers.record("m", ok=False)
    cooled_down(breakers)
    for _ in range(5):
        assert breakers.state("m") == "half_open"
    assert breakers.claim("m").state == "trial"


def test_a_trial_given_back_is_free_for_the_next_caller_and_only_its_owner_can_give_it_back(redis_url):
    breakers = make(redis_url, consecutive=1, cooldown_seconds=0.2, trial_seconds=60)
    breakers.record("m", ok=False)
    cooled_down(breakers)
    ours = breakers.claim("m")
    assert not breakers.give_back("m", "somebody-else")
    assert breakers.claim("m").state == "open"
    assert breakers.give_back("m", ours.trial)
    assert not breakers.give_back("m", ours.trial)  # twice is harmless
    theirs = breakers.claim("m")
    assert theirs.state == "trial" and theirs.trial != ours.trial


def test_a_trial_lasts_at_least_as_long_as_its_call_may(redis_url):
    breakers = make(redis_url, consecutive=1, cooldown_seconds=0.2, trial_seconds=0.1)
    breakers.record("m", ok=False)
    cooled_down(breakers)
    assert breakers.claim("m", call_seconds=30).state == "trial"
    time.sleep(0.3)  # past the policy's trial period, well inside the call's timeout
    assert breakers.claim("m").state == "open"  # no second, concurrent trial


def test_a_redis_timeout_in_the_breaker_is_redis_unavailable(one_redis_url):
    client = redis.Redis.from_url(one_redis_url, socket_timeout=0.2)
    breakers = Breakers(client, prefix="lanes:test")
    breakers.state("m")  # scripts loaded
    admin = redis.Redis.from_url(one_redis_url)
    admin.execute_command("CLIENT", "PAUSE", 1000, "ALL")
    try:
        with pytest.raises(RedisUnavailable, match="did not answer the breaker"):
            breakers.state("m")
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")

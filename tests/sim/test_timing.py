"""Service time: fixed, lognormal around its mean, slower past the knee."""

from __future__ import annotations

import statistics
import time

import httpx

from lanes.sim import SimModel, knee_factor, sample_timing
from lanes.sim.model import new_rng

from .conftest import chat_body


def test_a_fixed_service_time_is_exact_and_ignores_the_knee():
    model = SimModel(name="m", capacity=4, service_ms=50)
    timing = sample_timing(model, new_rng(model), running=4, max_tokens=None)
    assert timing.ttft_s == timing.total_s == 0.05


def test_token_timing_adds_a_per_token_time_after_the_first():
    model = SimModel(name="m", capacity=10, ttft_ms=100, per_token_ms=20, tokens=6, knee_slowdown=0)
    timing = sample_timing(model, new_rng(model), running=1, max_tokens=None)
    assert abs(timing.total_s - 0.2) < 1e-9
    assert sample_timing(model, new_rng(model), running=1, max_tokens=2).tokens == 2


def test_lognormal_draws_keep_the_configured_mean_and_are_reproducible():
    model = SimModel(name="m", capacity=10, service_ms=200, distribution="lognormal", sigma=0.5)
    rng = new_rng(model)
    draws = [sample_timing(model, rng, running=1, max_tokens=None).total_s for _ in range(20_000)]
    assert abs(statistics.fmean(draws) - 0.2) < 0.005
    assert statistics.pstdev(draws) > 0.05
    again = new_rng(model)
    assert [sample_timing(model, again, running=1, max_tokens=None).total_s for _ in range(5)] == draws[:5]


def test_service_slows_past_the_knee_like_a_real_engine():
    model = SimModel(name="m", capacity=10, knee=0.5, knee_slowdown=1.0)
    assert knee_factor(model, 5) == 1.0
    assert knee_factor(model, 10) == 2.0
    assert 1.0 < knee_factor(model, 8) < 2.0
    # token timing slows by default; a fixed service_ms does not
    assert knee_factor(SimModel(name="t", capacity=10), 10) == 1.5
    assert knee_factor(SimModel(name="f", capacity=10, service_ms=50), 10) == 1.0


def test_a_request_takes_at_least_its_service_time(start_sim):
    sim = start_sim(SimModel(name="m", capacity=1, ttft_ms=60, per_token_ms=10, tokens=5, knee_slowdown=0))
    started = time.monotonic()
    assert httpx.post(sim.base_url + "/chat/completions", json=chat_body("m")).status_code == 200
    assert time.monotonic() - started >= 0.1

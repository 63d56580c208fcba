"""Quantiles from Prometheus histograms: what vLLM's latency histograms say about an interval.

vLLM exports cumulative histograms (``vllm:inter_token_latency_seconds``,
``vllm:time_to_first_token_seconds``...). The growth of each bucket between
two scrapes is the histogram of the observations made in between; a
quantile is read from it as Prometheus's ``histogram_quantile`` does
(linear within the bucket it falls in; the highest finite bound when it
falls in ``+Inf``).
"""

from __future__ import annotations

import math

Buckets = list[tuple[float, float]]  # (upper bound, cumulative count), ascending, +Inf last


def delta(now: Buckets, before: Buckets | None) -> Buckets:
    """The observations between two readings of one histogram (a counter reset: ``now`` alone)."""
    if before is None:
        return list(now)
    old = dict(before)
    grown = [(le, count - old.get(le, 0.0)) for le, count in now]
    if any(count < 0 for _, count in grown):
        return list(now)  # the server restarted: its counts began again
    return grown


def count(buckets: Buckets) -> float:
    return buckets[-1][1] if buckets else 0.0


def quantile(buckets: Buckets, q: float) -> float | None:
    """The ``q`` quantile (0..1) of a cumulative histogram; None without observations."""
    total = count(buckets)
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for le, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(le):
                return lower
            inside = cumulative - below
            return lower + (le - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = le, cumulative
    return lower


def share_above(buckets: Buckets, x: float) -> float | None:
    """The share of observations above ``x`` (the CDF read linearly within a bucket, exact at a
    bound); None without observations. Exact when ``x`` is a bucket bound, so a target set at one
    of vLLM's bounds (25, 50, 75, 100 ms...) is judged without the guesswork of a quantile."""
    total = count(buckets)
    if total <= 0:
        return None
    lower, below = 0.0, 0.0
    for le, cumulative in buckets:
        if x <= le:
            if math.isinf(le) or le == lower:
                at = below  # above the highest finite bound: all of this bucket counts as over
            else:
                at = below + (cumulative - below) * (x - lower) / (le - lower)
            return max(0.0, (total - at) / total)
        lower, below = le, cumulative
    return 0.0


def merge(parts: list[Buckets]) -> Buckets:
    """The sum of histograms with the same bounds (several models of one endpoint)."""
    summed: dict[float, float] = {}
    for part in parts:
        for le, cumulative in part:
            summed[le] = summed.get(le, 0.0) + cumulative
    return sorted(summed.items())

"""What one engine counts: histograms, counters, and gauges published with a lag.

vLLM sets its gauges once per engine step, when the step's output reaches the
API server, so a scrape sees the state of the last step, seconds old under
load, and unchanged after a mass cancel until the next step runs.
:class:`PublishedGauges` keeps the snapshots taken at each step and answers
with the newest one at least ``lag`` old. Times are the caller's clock, so a
test or a discrete-event harness can drive it without sleeping.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

# vLLM's buckets (vllm/v1/metrics/loggers.py) so dashboards built on it fit.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
INTER_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                       2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
# vLLM exports a series per FinishReason, abort included, but counts only requests
# that finished in the engine: a request aborted by its client never reaches
# request_success_total (it is counted in ``aborted`` here, for /admin/stats).
FINISH_REASONS = ("stop", "length", "abort")


class Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.reset()

    def reset(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)  # last: +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        out, total = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts):
            total += count
            out.append((bound, total))
        return out


class EngineCounters:
    """The counters and histograms of one engine, exact at any moment."""

    def __init__(self) -> None:
        self.ttft = Histogram(TTFT_BUCKETS)
        self.inter_token = Histogram(INTER_TOKEN_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.reset()

    def reset(self) -> None:
        self.preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.steps = 0
        self.aborted = 0
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        for histogram in (self.ttft, self.inter_token, self.e2e, self.queue_time):
            histogram.reset()


@dataclass(frozen=True)
class GaugeSnapshot:
    """The scheduler's gauges as one step left them."""

    at: float
    running: int = 0
    waiting_capacity: int = 0
    waiting_deferred: int = 0
    kv_usage: float = 0.0

    @property
    def waiting(self) -> int:
        return self.waiting_capacity + self.waiting_deferred


class PublishedGauges:
    """Step snapshots, visible ``lag`` seconds after they were taken."""

    def __init__(self) -> None:
        self._visible = GaugeSnapshot(at=float("-inf"))  # before any step: zeros
        self._pending: deque[GaugeSnapshot] = deque()

    def record(self, snapshot: GaugeSnapshot, lag: float) -> None:
        self.at(snapshot.at, lag)  # what is visible by now needs no keeping
        self._pending.append(snapshot)

    def at(self, now: float, lag: float) -> GaugeSnapshot:
        """What a scrape at ``now`` sees."""
        while self._pending and self._pending[0].at <= now - lag:
            self._visible = self._pending.popleft()
        return self._visible

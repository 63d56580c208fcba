"""The time one walk may spend, and how it is shared between waits and calls.

Three clocks bound a walk:

- the request's **deadline** (wall clock, from the caller): the answer is of no
  use after it;
- the **admission deadline**: the deadline, or for deadline-less foreground
  work the admission cap from the walk's start; lane waits end by it, minus
  the reserve kept for the candidates after the one waited on;
- the **walk deadline**: delivery + the visibility budget (Celery's visibility
  timeout minus a margin). Every wait *and* every call of the walk ends before
  it, or the broker would hand the same task to a second worker while this one
  still works on it. A wait is therefore shortened by the call that must fit
  after it, and a walk that cannot fit its next call asks to be requeued.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CallLimits:
    """How long one call may take in all, and until its first token."""

    total: float
    first_token: float


@dataclass(frozen=True)
class WalkBudget:
    deadline: float | None
    admission_deadline: float | None
    walk_deadline: float

    def admission_budget(self, now: float, reserve: float) -> float | None:
        """Seconds a lane wait may last (None: no deadline, only the walk bounds it)."""
        if self.admission_deadline is None:
            return None
        return self.admission_deadline - now - reserve

    def wait_room(self, now: float, call_seconds: float) -> float:
        """Seconds a wait may last and still leave ``call_seconds`` for the call in the walk."""
        if self.deadline is not None and self.deadline <= self.walk_deadline:
            # The call is cut at the deadline, which comes before the walk's end.
            return self.walk_deadline - now if self.deadline > now else 0.0
        return self.walk_deadline - now - call_seconds

    def call_limits(self, now: float, model_timeout: float, reserve: float) -> CallLimits | None:
        """The limits of a call starting now, or None when no time is left for one.

        The whole call ends by the deadline and within the walk; its first
        token must come before the deadline minus the ``reserve`` kept for the
        candidates after this one, so a hung backend cannot eat their time. A
        candidate taken on a free slot after that reserve was already reached
        (a free slot is used whatever the budget) waits at most half the time
        left for its first token: the other half stays for the candidates after it.
        """
        total = min(model_timeout, self.walk_deadline - now)
        first = model_timeout
        if self.deadline is not None:
            left = self.deadline - now
            total = min(total, left)
            first = min(first, max(left - reserve, left / 2 if reserve > 0 else left))
        first = min(first, total)
        if total <= 0 or first <= 0:
            return None
        return CallLimits(total=total, first_token=first)


def start_budget(*, deadline: float | None, admission_cap: float | None, walk_seconds: float,
                 started: float, delivered_at: float | None) -> WalkBudget:
    """The budget of a walk that starts at ``started`` (its message delivered at ``delivered_at``)."""
    admission = deadline
    if admission is None and admission_cap is not None:
        admission = started + admission_cap
    origin = delivered_at if delivered_at is not None and delivered_at <= started else started
    return WalkBudget(deadline=deadline, admission_deadline=admission, walk_deadline=origin + walk_seconds)

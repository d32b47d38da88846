"""The commit rate a master sees on its repo, and the warning when it nears the Hub's limit.

At start a node knows only the nodes it has seen in ``step_count.json``; the master sees the
fleet's real pace as it runs: every delta first listed is a worker's commit (its own local
worker's too), every publish and squash its own. ``CommitRates`` counts both in sliding windows
and words one warning, naming the knob to turn, at most once per ``RATE_WARNING_EVERY_S``.
Stdlib only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from speedtronic.distributed.hub.cadence import observed_commit_warning
from speedtronic.hub.budget import Budget

RATE_WARNING_EVERY_S = 3600.0  # an observed-rate warning is repeated at most this often


class CommitRates:
    """Deltas arriving and this master's own commits, on ``clock``; thread-safe."""

    def __init__(self, repo_id: str, clock: Callable[[], float]):
        self.repo_id, self.clock = repo_id, clock
        self._arrivals, self._publishes = Budget(clock), Budget(clock)
        self._lock = threading.Lock()
        self.inner_steps: int | None = None  # known after the transport's prepare()
        self._warned_at: float | None = None

    def arrived(self, deltas: int) -> None:
        for _ in range(deltas):
            self._arrivals.count_commit()

    def committed(self) -> None:
        """One publish or squash of this master's."""
        self._publishes.count_commit()

    def warning(self) -> str | None:
        """A line when deltas plus publishes near the Hub's commit limit; at most once an hour."""
        with self._lock:
            now, last = self.clock(), self._warned_at
            if self.inner_steps is None or (last is not None and now - last < RATE_WARNING_EVERY_S):
                return None
            message = observed_commit_warning(
                deltas_per_hour=self._arrivals.commits_per_hour(),
                publishes_per_hour=self._publishes.commits_per_hour(),
                inner_steps=self.inner_steps,
            )
            if message is None:
                return None
            self._warned_at = now
        return f"{self.repo_id}: {message}"

"""Hub budgets: counting the requests and commits a process spends against the Hub's limits.

The Hugging Face Hub answers 429 beyond about 128 commits an hour on one repo, and beyond
1,000 API calls in 5 minutes for a free account (shared by every process using that account).
Requests to the storage an LFS file is PUT to or downloaded from (S3, a CDN) do not count
against that limit, so they are counted apart. ``Budget`` counts what this process spent in
sliding windows (thread-safe: a node's threads share one) so callers can report it as
metrics. Stdlib only, no I/O.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

HUB_COMMITS_PER_HOUR = 128
HUB_CALLS_PER_5_MIN = 1000
KEEP_S = 3600.0  # the longest window anyone asks about; older timestamps are dropped


class Budget:
    """Sliding-window counters of API calls and commits, in ``clock`` seconds."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        self._lock = threading.Lock()
        self._calls: deque[float] = deque()
        self._storage: deque[float] = deque()
        self._commits: deque[float] = deque()

    def count_call(self) -> None:
        """One request to the Hub's API origin: what its per-account limit counts."""
        self._add(self._calls)

    def count_storage(self) -> None:
        """One request to another origin (LFS storage, a CDN): outside the Hub's API limit."""
        self._add(self._storage)

    def count_commit(self) -> None:
        self._add(self._commits)

    def calls(self, window_s: float) -> int:
        """API calls in the last ``window_s`` seconds, exclusive (at most an hour is kept)."""
        return self._count(self._calls, window_s)

    def storage(self, window_s: float) -> int:
        """Storage and CDN requests in the last ``window_s`` seconds (at most an hour)."""
        return self._count(self._storage, window_s)

    def commits(self, window_s: float) -> int:
        """Commits in the last ``window_s`` seconds (at most the last hour is kept)."""
        return self._count(self._commits, window_s)

    def commits_per_hour(self) -> float:
        """The commit rate: the last hour's count, or the last 10 minutes' pace if higher (a
        fleet that just sped up is seen before a whole hour of it has passed)."""
        return float(max(self.commits(3600.0), self.commits(600.0) * 6))

    def snapshot(self) -> dict:
        return {
            "hub_calls_5min": self.calls(300.0),
            "hub_calls_1h": self.calls(3600.0),
            "hub_storage_5min": self.storage(300.0),
            "hub_storage_1h": self.storage(3600.0),
            "hub_commits_1h": self.commits(3600.0),
        }

    def _add(self, stamps: deque[float]) -> None:
        with self._lock:
            now = self.clock()
            stamps.append(now)
            self._prune(stamps, now)

    def _count(self, stamps: deque[float], window_s: float) -> int:
        with self._lock:
            now = self.clock()
            self._prune(stamps, now)
            cutoff = now - window_s
            # Newest on the right; walking from there touches only the window's stamps.
            n = 0
            for stamp in reversed(stamps):
                if stamp <= cutoff:
                    break
                n += 1
            return n

    @staticmethod
    def _prune(stamps: deque[float], now: float) -> None:
        while stamps and stamps[0] <= now - KEEP_S:
            stamps.popleft()

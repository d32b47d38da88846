"""The Hub emulator's commit budget: at most ``limit`` commits per repo in any ``window_s``.

The Hub refuses commits beyond about 128 an hour on one repo with a 429. ``CommitBudget``
models it as a sliding window over the commits that landed (a refused commit is not applied
and not counted): a commit over the budget is answered 429 with the headers the other 429s
carry (``Retry-After`` and the IETF ``RateLimit`` / ``RateLimit-Policy`` pair that
huggingface_hub's ``parse_ratelimit_headers`` reads: remaining 0, the seconds until the oldest
commit in the window leaves it, the limit and the window). Off unless a test or
``--commit-limit`` sets it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from hub_emulator_faults import Reject, rate_limit_headers

MESSAGE = "You have exceeded the rate limit for repository commits; you can retry later."


class CommitBudget:
    """Commits each repo made in the last ``window_s`` seconds, on ``clock``."""

    def __init__(self, limit: int, window_s: float, clock: Callable[[], float]):
        if limit < 1 or window_s <= 0:
            raise ValueError(f"commit budget: limit {limit} and window {window_s} must be > 0")
        self.limit, self.window_s, self.clock = limit, window_s, clock
        self.landed: dict[str, deque[float]] = {}
        self.refused = 0

    def check(self, repo_id: str) -> None:
        """Raise the Hub's 429 when ``repo_id`` has spent its budget; call before applying."""
        now, times = self.clock(), self.landed.setdefault(repo_id, deque())
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if len(times) < self.limit:
            return
        self.refused += 1
        reset = max(1, math.ceil(times[0] + self.window_s - now))
        headers = rate_limit_headers(
            reset, resource="commits", limit=self.limit, window_s=math.ceil(self.window_s)
        )
        raise Reject(429, MESSAGE, headers=headers)

    def spend(self, repo_id: str) -> None:
        """Count a commit that landed on ``repo_id``."""
        self.landed.setdefault(repo_id, deque()).append(self.clock())

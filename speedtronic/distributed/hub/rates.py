"""The commit rate a master sees on its repo, and the warning when it nears the Hub's limit.

At start a node knows only the nodes it has seen in ``step_count.json``; the master sees the
fleet's real pace as it runs: every delta first listed is a worker's commit (its own local
worker's too), every publish and squash its own. ``CommitRates`` measures each source's pace
from its own commits: a worker commits once per inner loop, so two of its commits seen apart
give its rate, and the fleet's rate is the sum, meaningful one inner loop into a run. A window
of the last hour or ten minutes is not: early in a run it holds a few seconds of commits that
it spreads over the whole window (it said 108 an hour at 8 s into a run committing 8,000), and
a burst of first deltas is not a pace. It words one warning, naming the knob to turn, at most
once per ``RATE_WARNING_EVERY_S``, or sooner when the rate has doubled since. Stdlib only.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable

from speedtronic.distributed.hub.cadence import observed_commit_warning
from speedtronic.distributed.protocol import parse_delta_path

RATE_WARNING_EVERY_S = 3600.0  # an observed-rate warning is repeated at most this often...
RATE_GROWTH_TO_REPEAT = 2.0  # ... unless the rate grew this much since (the advice was short)
KEEP_S = 3600.0  # commits older than this say nothing about the pace now
MIN_PACE_SPAN_S = 30.0  # a pace rests on sightings at least this far apart (or one period)
STOPPED_AFTER_PERIODS = 3.0  # a source silent this many periods (or listing gaps) stopped
OWN = "<this master>"  # the source of the master's own publishes and squashes


class _Pace:
    """When one source's commits were seen (a listing finds several at once): its rate is the
    commits after the first sighting over the time since it, so a batch of ``n`` seen at one
    listing counts ``n`` commits. Sightings less than ``MIN_PACE_SPAN_S`` apart give no rate
    yet: two listings a second apart catch batches by chance; one period apart they time it."""

    def __init__(self) -> None:
        self.seen: deque[tuple[float, int]] = deque()  # (when, commits seen then)

    def add(self, when: float, commits: int) -> None:
        self.seen.append((when, commits))

    def per_hour(self, now: float) -> float | None:
        """Commits an hour at its pace now; 0 when stopped or gone, None when not known yet."""
        while self.seen and self.seen[0][0] <= now - KEEP_S:
            self.seen.popleft()
        if not self.seen:
            return 0.0
        first, last = self.seen[0][0], self.seen[-1][0]
        if last - first < MIN_PACE_SPAN_S:
            return None  # a few listings' worth: the batches they happened to catch
        later = sum(n for _, n in list(self.seen)[1:])
        period, gap = (last - first) / later, (last - first) / (len(self.seen) - 1)
        if now - last > STOPPED_AFTER_PERIODS * max(period, gap):
            return 0.0  # silent for three of its periods (or of the listings' gaps): stopped
        return 3600.0 / period if period > 0 else 0.0


class CommitRates:
    """Deltas arriving (by node) and this master's own commits, on ``clock``; thread-safe."""

    def __init__(self, repo_id: str, clock: Callable[[], float]):
        self.repo_id, self.clock = repo_id, clock
        self._paces: dict[str, _Pace] = {}
        self._lock = threading.Lock()
        self.inner_steps: int | None = None  # known after the transport's prepare()
        self._warned: tuple[float, float] | None = None  # (when, at what rate)

    def arrived(self, paths: Iterable[str]) -> None:
        """Deltas first listed now (each a worker's commit), by the node that sent them."""
        by_node: dict[str, int] = {}
        for path in paths:
            parsed = parse_delta_path(path)
            if parsed is not None:  # strangers are no one's pace
                by_node[parsed[0]] = by_node.get(parsed[0], 0) + 1
        with self._lock:
            now = self.clock()
            for node, commits in by_node.items():
                self._paces.setdefault(node, _Pace()).add(now, commits)

    def committed(self) -> None:
        """One publish or squash of this master's."""
        with self._lock:
            self._paces.setdefault(OWN, _Pace()).add(self.clock(), 1)

    def per_hour(self) -> tuple[float, float]:
        """(the workers' deltas, this master's commits) per hour, at their pace now."""
        with self._lock:
            now = self.clock()
            rates = {source: pace.per_hour(now) for source, pace in self._paces.items()}
        own = rates.pop(OWN, None) or 0.0
        known = [rate for rate in rates.values() if rate is not None]
        if not known:
            return 0.0, own
        # a node seen only just now is taken at the others' mean pace until it has its own
        return sum(known) * len(rates) / len(known), own

    def warning(self) -> str | None:
        """A line when deltas plus publishes near the Hub's commit limit; at most once an hour,
        unless the rate has doubled since the last line."""
        deltas, own = self.per_hour()
        with self._lock:
            if self.inner_steps is None or not self._due(deltas + own):
                return None
            message = observed_commit_warning(
                deltas_per_hour=deltas, publishes_per_hour=own, inner_steps=self.inner_steps
            )
            if message is None:
                return None
            self._warned = (self.clock(), deltas + own)
        return f"{self.repo_id}: {message}"

    def _due(self, rate: float) -> bool:
        if self._warned is None:
            return True
        when, warned_rate = self._warned
        grown = rate >= RATE_GROWTH_TO_REPEAT * warned_rate
        return grown or self.clock() - when >= RATE_WARNING_EVERY_S

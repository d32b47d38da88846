"""How long the end of a node's run may still wait: a stop is not an end (docs/diloco.md).

A run that ends normally waits as I6 says (its last uploads, a global holding its last delta,
the master's drain). A signal (SIGTERM, Ctrl-C) is a stop: the node has saved its checkpoint
first (``Trainer``'s ``on_stop``), and whatever waiting is left is cut to
``distributed.stop_grace_s`` from the moment the end first looks at its clock after the
signal; a second signal cuts it to nothing. A container's stop sends SIGKILL 10 s after SIGTERM:
a wait of minutes there would only lose the checkpoint.

The signals are read from the trainer (``stop_signal`` and ``signals``, its count); ``Signals``
is the same record for a master that does not train. Objects without them never stop early.
"""

from __future__ import annotations

import math
import time
from typing import Any


class Signals:
    """The stop signals a process received: the first, and how many (``Trainer``'s fields)."""

    def __init__(self) -> None:
        self.stop_signal: int | None = None
        self.signals = 0

    def record(self, signum: int) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum
        self.signals += 1


def stopping(source: Any) -> bool:
    """Whether a signal asked ``source`` (a trainer or ``Signals``) to stop."""
    return getattr(source, "stop_signal", None) is not None


def hurried(source: Any) -> bool:
    """Whether a second signal came: every wait ends at once."""
    return getattr(source, "signals", 0) >= 2


class EndClock:
    """What is left of an end's wait: ``full_s`` for a normal end, cut to ``grace_s`` once a
    signal came, to nothing after a second one."""

    def __init__(self, source: Any, grace_s: float, full_s: float = math.inf):
        self.source, self.grace_s = source, grace_s
        self.deadline = time.monotonic() + full_s
        self.cut = False

    @property
    def stopping(self) -> bool:
        return stopping(self.source)

    def left(self) -> float:
        """Seconds the end may still wait (0: none)."""
        now = time.monotonic()
        if hurried(self.source):
            return 0.0
        if not self.cut and stopping(self.source):
            self.cut = True
            self.deadline = min(self.deadline, now + self.grace_s)
        return max(0.0, self.deadline - now)

    def limit(self, seconds: float) -> float:
        """``seconds``, or less when the clock has less left."""
        return min(seconds, self.left())


def end_clock(source: Any, config: Any, full_s: float = math.inf) -> EndClock:
    """An ``EndClock`` with the grace of ``config`` (a distributed section; 5 s without one)."""
    return EndClock(source, float(getattr(config, "stop_grace_s", 5.0)), full_s)

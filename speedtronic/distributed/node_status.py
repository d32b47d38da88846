"""What a DumbDiLoCo node's parts share: its stop event, its first permanent failure, counters.

The training thread's plug-in, the uploader thread and the poller thread each hold the same
``NodeStatus``: a permanent transport failure (no access, no repo) seen by any of them stops
the others and is raised in the training thread at its next step, exit 1. Counters are plain
integers reported in the boundary events. ``Throttle`` keeps a failure that repeats at every
poll (a repo down for an hour, polled 5 times a second) to one line a minute. Stdlib only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class NodeStatus:
    """A node's stop event, its first permanent failure and its transfer counters."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.fatal: Exception | None = None
        self.counters = {"uploads": 0, "upload_failures": 0, "bytes_up": 0, "bytes_down": 0}

    def stop_if_permanent(self, exc: BaseException) -> None:
        """A permanent failure (no access, no repo) ends the run at the next step, exit 1."""
        if getattr(exc, "permanent", False) and self.fatal is None:
            self.fatal = exc
            self.stop.set()

    def raise_if_fatal(self) -> None:
        if self.fatal is not None:
            raise self.fatal


class Throttle:
    """Lets each distinct message through at most once per ``every_s`` seconds; the next one
    let through says how many were held back meanwhile."""

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.every_s, self.clock = every_s, clock
        self._last: dict[str, tuple[float, int]] = {}  # message -> (said at, held back since)

    def line(self, message: str) -> str | None:
        """``message`` to log now (with the count held back), or None to stay quiet."""
        now = self.clock()
        said_at, held = self._last.get(message, (-float("inf"), 0))
        if now - said_at < self.every_s:
            self._last[message] = (said_at, held + 1)
            return None
        if len(self._last) > 256:  # messages that vary without end: forget the old ones
            self._last.clear()
        self._last[message] = (now, 0)
        return message if not held else f"{message} ({held} more like it in {self.every_s:g} s)"

"""What a DumbDiLoCo node's parts share: its stop event, its first permanent failure, counters.

The training thread's plug-in, the uploader thread and the poller thread each hold the same
``NodeStatus``: a permanent transport failure (no access, no repo) seen by any of them stops
the others and is raised in the training thread at its next step, exit 1. Counters are plain
integers reported in the boundary events. Stdlib only.
"""

from __future__ import annotations

import threading


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

"""What a bucket master deletes after each publish: consumed deltas, superseded weights, leftovers.

A bucket keeps no history, so nothing is reclaimed unless it is deleted. ``Garbage`` remembers
the weights objects there (listed once, at the first publish: a crashed master may have left
some; then every one this master writes), and after a publish swapped the pointer it deletes in
one DeleteObjects the deltas the round consumed, every weights object but the new one and the
one just replaced (a worker that read the previous pointer a moment ago still finds its
weights), and whatever failed to go last time. A delete that fails never fails the publish,
which has landed: it is tried again with the next one, and a warning says so. Only names that
``protocol.is_weights_key`` gives are touched under ``global/weights/``, and only deltas'
paths (``protocol.check_deletable``) elsewhere. Stdlib only.
"""

from __future__ import annotations

import threading
from typing import Any

from speedtronic.distributed.protocol import WEIGHTS_DIR, check_deletable, is_weights_key
from speedtronic.errors import TransportError


class Garbage:
    """The deletes owed by one master's publishes, over ``client`` (an ``S3Client``)."""

    def __init__(self, client: Any):
        self.client = client
        self._lock = threading.Lock()
        self._globals: set[str] | None = None  # weights objects there; None: not listed yet
        self._leftovers: set[str] = set()  # objects whose delete failed: tried again
        self.deleted = self.failed = 0

    def know_globals(self) -> None:
        """List ``global/weights/`` once: one request, at the first publish."""
        with self._lock:
            if self._globals is not None:
                return
        found = {i.path for i in self.client.list(WEIGHTS_DIR) if is_weights_key(i.path)}
        with self._lock:
            self._globals = found | (self._globals or set())

    def wrote(self, key: str) -> None:
        with self._lock:
            self._globals = (self._globals or set()) | {key}

    def collect(self, consumed: list[str], keep: set[str]) -> tuple[list[str], str | None]:
        """Delete ``consumed``, superseded weights (all but ``keep``) and the leftovers; the
        paths deleted, and a warning if some could not be."""
        consumed = [check_deletable(p) for p in consumed]  # deltas only, as a round consumes
        with self._lock:
            superseded = sorted((self._globals or set()) - keep)
            targets = list(dict.fromkeys([*consumed, *superseded, *sorted(self._leftovers)]))
        if not targets:
            return [], None
        try:
            failed = set(self.client.delete(targets))
            reason = "refused by the store"
        except TransportError as exc:  # the publish landed; these wait for the next one
            failed, reason = set(targets), str(exc)
        with self._lock:
            self._globals = (self._globals or set()) - (set(superseded) - failed)
            self._leftovers = failed
            self.deleted += len(targets) - len(failed)
            self.failed += len(failed)
        if not failed:
            return targets, None
        warning = (
            f"{self.client.url()}: could not delete {len(failed)} object(s) after the publish "
            f"({reason}); tried again with the next one"
        )
        return [t for t in targets if t not in failed], warning

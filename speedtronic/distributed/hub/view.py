"""What one node last saw of its Hub repo, so an idle node asks the Hub as little as it can.

``RepoView`` keeps the last head seen, the last listing of ``nodes/`` (with the revision each
path was listed at, so a delta is read from the commit it was listed in), the last
``step_count.json`` read (with its revision, so the weights are read from the same commit) and
the versions of the step count this node read or wrote (any other is another master's). Its
lock guards only these caches and is never held during a request. ``Tally`` counts what the
transport did, for its stats; ``read_step_count_at`` reads a step count at a revision.
Stdlib only.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, STEP_COUNT, parse_step_count
from speedtronic.distributed.transport import MAX_STEP_COUNT_BYTES, DeltaRef
from speedtronic.errors import TransportError
from speedtronic.hub.files import git_blob_oid


@dataclass(frozen=True)
class StepCountRead:
    """``step_count.json`` as read at ``head``: its parsed value (None: absent) or the error,
    and its git blob id."""

    head: str
    value: dict[str, Any] | None
    error: str | None = None
    oid: str | None = None


def read_step_count_at(client: Any, revision: str) -> StepCountRead:
    """``step_count.json`` at ``revision`` through ``client`` (a ``HubClient``): one download."""
    data = client.download(STEP_COUNT, revision, MAX_STEP_COUNT_BYTES)
    if data is None:
        return StepCountRead(revision, None)
    oid = git_blob_oid(data)
    try:
        return StepCountRead(revision, parse_step_count(data), oid=oid)
    except TransportError as exc:
        return StepCountRead(revision, None, f"{client.repo_id}: {exc}", oid)


class RepoView:
    """The caches of one transport; thread-safe (a node's uploader and poller share them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._head: str | None = None  # the head this node saw or made last
        self._listing: tuple[str, list[DeltaRef]] | None = None  # (revision, refs)
        self._pins: dict[str, str] = {}  # delta path -> the revision it was listed at
        self._step: StepCountRead | None = None
        self._own_step_oids: set[str] = set()  # step_count.json versions read or written here

    @property
    def head(self) -> str | None:
        with self._lock:
            return self._head

    def saw_head(self, head: str) -> None:
        with self._lock:
            self._head = head

    def current_head(self, client: Any) -> str:
        """Ask ``client`` for the repo's head now, and remember it."""
        head = client.head()
        self.saw_head(head)
        return head

    def listing_at(self, head: str) -> list[DeltaRef] | None:
        """The cached listing if it was taken at ``head``, else None."""
        with self._lock:
            if self._listing is not None and self._listing[0] == head:
                return list(self._listing[1])
        return None

    def store_listing(self, head: str, refs: list[DeltaRef]) -> list[str]:
        """Keep ``refs`` as listed at ``head``; returns the paths new since the last listing
        (none for the first: it holds the past, not arrivals)."""
        with self._lock:
            before = None if self._listing is None else {r.path for r in self._listing[1]}
            self._listing = (head, list(refs))
            self._pins = {r.path: head for r in refs}
        return [] if before is None else [r.path for r in refs if r.path not in before]

    def revision_of(self, path: str) -> str | None:
        """Where ``path`` should be read: a delta where it was listed, a global file where the
        step count was read; None when unknown (read at the current head)."""
        with self._lock:
            if path in (GLOBAL_WEIGHTS, STEP_COUNT):
                return self._step.head if self._step is not None else None
            return self._pins.get(path)

    def step_at(self, head: str) -> StepCountRead | None:
        with self._lock:
            return self._step if self._step is not None and self._step.head == head else None

    @property
    def step(self) -> StepCountRead | None:
        with self._lock:
            return self._step

    def store_step(self, read: StepCountRead) -> None:
        with self._lock:
            self._step = read
            if read.oid is not None:  # seen by this node: not a stranger's publish
                self._own_step_oids.add(read.oid)

    def own(self, oid: str) -> None:
        """``oid`` is a step count version this node read or wrote (or one it may write)."""
        with self._lock:
            self._own_step_oids.add(oid)

    def is_own(self, oid: str) -> bool:
        with self._lock:
            return oid in self._own_step_oids

    def published(self, parent: str, head: str, body: bytes, deletes: list[str]) -> None:
        """After our own commit on ``parent``: its step count is ours; the listing, if taken at
        ``parent``, loses the deletes (nothing else changed between the two)."""
        gone, oid = set(deletes), git_blob_oid(body)
        with self._lock:
            self._head = head
            self._step = StepCountRead(head, json.loads(body), oid=oid)
            self._own_step_oids = {oid}
            if self._listing is not None and self._listing[0] == parent:
                self._listing = (head, [r for r in self._listing[1] if r.path not in gone])
                self._pins = {p: rev for p, rev in self._pins.items() if p not in gone}

    def forget(self) -> None:
        """Drop every cached head, listing, pin and step count (their revisions are gone)."""
        with self._lock:
            self._head, self._listing, self._pins, self._step = None, None, {}, None


class Tally:
    """Thread-safe counters by name."""

    def __init__(self, *names: str):
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(names, 0)

    def add(self, name: str) -> int:
        """One more ``name``; returns the new count."""
        with self._lock:
            self._counts[name] += 1
            return self._counts[name]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

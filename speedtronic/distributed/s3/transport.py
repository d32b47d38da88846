"""The DumbDiLoCo ``Transport`` over an S3 bucket: a layout with no git commit behind it.

Deltas are objects under ``nodes/<node_id>/`` (one PUT each, no per-repo commit budget). A
publish writes the weights under a step- and content-named key (``global/weights/<step>-<sha>``)
first, then replaces ``global/step_count.json`` with a conditional PUT (``If-Match`` on the
ETag this master last read or wrote, ``If-None-Match: *`` when there was none): that pointer is
the commit point, so a reader never sees a step count naming weights that are not there, and a
second master shows up as a refused write whose step count is not ours. Consumed deltas and
superseded weights are deleted after the swap (``garbage.Garbage``). Reads of
``global/latest.safetensors`` (the documented, logical name) fetch the object the last step
count read names, checked against its sha256; reads of a listed delta are pinned to the listed
ETag. An idle poll is one LIST (master) or one GET of the
pointer answered 304 (worker). The HTTP side (retries, timeouts, counting) is ``S3Client``'s.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from typing import Any

from speedtronic.distributed.protocol import (
    GLOBAL_WEIGHTS,
    NODES_DIR,
    STEP_COUNT,
    check_deletable,
    delta_path_problem,
    parse_step_count,
    weights_key,
)
from speedtronic.distributed.s3.admin import check_access
from speedtronic.distributed.s3.errors import NOT_MODIFIED, PreconditionFailed
from speedtronic.distributed.s3.garbage import Garbage
from speedtronic.distributed.transport import MAX_STEP_COUNT_BYTES, DeltaRef
from speedtronic.errors import DamagedRepoFile, TransportError

MAX_PUBLISH_ATTEMPTS = 5  # pointer writes refused in a row (a late landing of ours, a restart)


@dataclass(frozen=True)
class Pointer:
    """``step_count.json`` as last read or written: its checked value (None: absent or bad),
    ETag (None: absent), the sha256 of its bytes, and why it is bad, if it is."""

    value: dict[str, Any] | None
    etag: str | None
    sha: str | None = None
    error: str | None = None


ABSENT = Pointer(None, None)


class S3Transport:
    """``Transport`` over ``client`` (an ``s3.S3Client``); shared by a node's threads.

    ``min_publish_interval_s`` is kept for the master: a bucket has no commit budget, but every
    publish is the full weights, downloaded by every worker.
    """

    def __init__(self, client: Any, *, min_publish_interval_s: float = 0.0):
        self.client = client
        self.node_id: str = client.node_id or ""
        self.min_publish_interval_s = min_publish_interval_s
        self.conditional = True  # False: the store ignores If-Match (found by prepare)
        self._lock = threading.Lock()  # guards everything below; never held during a request
        self._pointer: Pointer | None = None  # the newest step_count read or written here
        self._own: set[str] = set()  # sha256 of the step_count bodies this process wrote
        self._pins: dict[str, str] = {}  # delta path -> the ETag it was listed with
        self._garbage = Garbage(client)  # what the master's publishes delete
        self._warnings: list[str] = []
        self._counts = dict.fromkeys(("uploads", "publishes", "publish_conflicts"), 0)

    def describe(self) -> str:
        return self.client.url()

    def stats(self) -> dict[str, int]:
        """Requests per operation, bytes and this transport's counts; numbers only (logged)."""
        with self._lock:
            counts = {f"s3_{name}": value for name, value in self._counts.items()}
        counts["s3_deleted"], counts["s3_delete_failures"] = (
            self._garbage.deleted,
            self._garbage.failed,
        )
        return {**self.client.counter.snapshot(), **counts}

    def take_warnings(self) -> list[str]:
        """One-line warnings (deletes that failed) since the last call, for the caller to log."""
        with self._lock:
            taken, self._warnings = self._warnings, []
        return taken

    def prepare(self, settings: Any, logger: Any) -> None:
        """Before training: the bucket exists (a master creates it), these credentials can
        write, and (master) the store honours conditional writes; a refusal is one line now."""
        try:
            self.conditional = check_access(self.client, settings.role, logger)
        except TransportError as exc:  # the store is down for now: training starts anyway (I5)
            if getattr(exc, "permanent", False):
                raise
            logger.warn(f"diloco: could not check {self.describe()} at start ({exc}); going on")

    def cadence_warnings(self, settings: Any, step_time_s: float | None) -> list[str]:
        return []  # thousands of requests a second per prefix: no budget a fleet reaches

    # ------------------------------------------------------------------ workers

    def upload(self, path: str, data: bytes) -> None:
        """One PUT; raises only when it did not land (``maybe_landed`` when it cannot tell)."""
        self.client.put(check_repo_path(path), data)
        with self._lock:
            self._counts["uploads"] += 1

    # ------------------------------------------------------------------ reads

    def list_deltas(self) -> list[DeltaRef]:
        """Every object under ``nodes/`` (one LIST per 1,000), strangers with their problem."""
        refs, pins = [], {}
        for item in self.client.list(NODES_DIR):
            problem = "a folder" if item.path.endswith("/") else delta_path_problem(item.path)
            refs.append(DeltaRef(item.path, item.size, f"{item.etag}-{item.size}", problem))
            if problem is None:
                pins[item.path] = item.etag
        with self._lock:
            self._pins = pins
        return sorted(refs, key=lambda r: r.path)

    def read(self, path: str, max_bytes: int) -> bytes | None:
        """``path``'s bytes, None if absent. A listed delta is read at its listed ETag (None if
        it changed since); ``global/latest.safetensors`` is the object the last step count
        read names, checked against its sha256."""
        check_repo_path(path)
        if path == GLOBAL_WEIGHTS:
            return self._read_global(max_bytes)
        with self._lock:
            pin = self._pins.get(path)
        try:
            got = self.client.get(path, max_bytes, if_match=pin)
        except PreconditionFailed:
            return None  # replaced since the listing: the next one lists its new version
        return None if got is None else got.data

    def file_version(self, path: str) -> str | None:
        """``path``'s ETag (it changes with the bytes), None if absent: one listing of its
        folder, where reading a keyframe to check it would download the full weights."""
        check_repo_path(path)
        listed = self.client.list(path.rsplit("/", 1)[0])
        return next((item.etag for item in listed if item.path == path), None)

    def _read_global(self, max_bytes: int) -> bytes | None:
        with self._lock:
            pointer = self._pointer
        if pointer is None:
            self.read_step_count()
            with self._lock:
                pointer = self._pointer
        if pointer is None or pointer.value is None:
            return None
        key, sha = pointer.value.get("weights_key"), pointer.value.get("weights_sha256")
        if key is None:
            raise DamagedRepoFile(
                f"{self.client.url(STEP_COUNT)} names no weights_key: it was not written by a "
                "bucket master (copy a run between stores with its master, not by hand)"
            )
        got = self.client.get(key, max_bytes)
        if got is None:
            return None  # superseded and deleted since: the next poll reads the new pointer
        if sha is not None and hashlib.sha256(got.data).hexdigest() != sha:
            raise DamagedRepoFile(
                f"{self.client.url(key)} does not match the weights_sha256 of {STEP_COUNT}; "
                "not used"
            )
        return got.data

    def read_step_count(self) -> dict[str, Any] | None:
        """``step_count.json``: one GET, answered 304 (no body) while it is unchanged."""
        with self._lock:
            known = self._pointer
        etag = known.etag if known is not None else None
        got = self.client.get(STEP_COUNT, MAX_STEP_COUNT_BYTES, if_none_match=etag)
        if got is NOT_MODIFIED:
            pointer = known
        else:
            pointer = ABSENT if got is None else self._parse(got.data, got.etag)
            with self._lock:
                self._pointer = pointer
        if pointer.error is not None:  # the store answered; the file is what is wrong
            raise DamagedRepoFile(pointer.error)
        return _copy(pointer.value)

    def _parse(self, data: bytes, etag: str) -> Pointer:
        sha = hashlib.sha256(data).hexdigest()
        try:
            return Pointer(parse_step_count(data), etag, sha)
        except TransportError as exc:
            return Pointer(None, etag, sha, f"{self.client.url()}: {exc}")

    # ------------------------------------------------------------------ the master

    def publish(self, weights: bytes, step_count: dict[str, Any], consumed: list[str]) -> None:
        """The weights under their own key, then the pointer swap, then the deletes.

        Raises only when the pointer did not move (an orphaned weights object is deleted with a
        later publish); the deletes after the swap never fail the publish.
        """
        wanted = [check_deletable(p) for p in consumed]  # refused before anything is written
        outer_step, sha = step_count["outer_step"], hashlib.sha256(weights).hexdigest()
        key = weights_key(outer_step, sha)
        body = {**step_count, "weights_key": key, "weights_sha256": sha}
        data = json.dumps(body, indent=2).encode() + b"\n"
        body_sha = hashlib.sha256(data).hexdigest()
        with self._lock:  # a retried write of ours may land late: it is not another master's
            self._own.add(body_sha)
        self._garbage.know_globals()
        self.client.put(key, weights)
        self._garbage.wrote(key)
        replaced = self._swap(data, body_sha, outer_step, step_count.get("master"))
        keep = {key} | ({replaced["weights_key"]} if "weights_key" in replaced else set())
        deleted, warning = self._garbage.collect(wanted, keep)
        with self._lock:
            self._counts["publishes"] += 1
            self._pins = {p: e for p, e in self._pins.items() if p not in set(deleted)}
            self._warnings += [warning] if warning else []

    def _swap(
        self, data: bytes, sha: str, outer_step: int, master: str | None = None
    ) -> dict[str, Any]:
        """Replace the pointer with ``data`` unless another master's is there; the value it
        replaced ({} if none)."""
        with self._lock:
            base = self._pointer
        base = base if base is not None else self._fresh_pointer()
        for _ in range(MAX_PUBLISH_ATTEMPTS):
            if not self.conditional:  # no If-Match on this store: check as late as we can
                base = self._fresh_pointer()
            self._check_no_other_master(base, outer_step, master)
            try:
                etag = self._put_pointer(data, base)
            except PreconditionFailed:
                with self._lock:
                    self._counts["publish_conflicts"] += 1
                base = self._fresh_pointer()
                if base.sha == sha:  # our own write, its answer lost: it landed
                    return self._replaced_by(base)
                continue
            with self._lock:
                self._pointer = Pointer(parse_step_count(data), etag, sha)
            return base.value or {}
        raise TransportError(
            f"could not publish outer step {outer_step} to {self.describe()}: "
            f"{STEP_COUNT} changed under {MAX_PUBLISH_ATTEMPTS} writes in a row; the next "
            "round tries again"
        )

    def _replaced_by(self, landed: Pointer) -> dict[str, Any]:
        """After finding our lost write landed: it is the pointer now; what it replaced is not
        known any more, so only the new weights are kept (the older ones go as superseded)."""
        with self._lock:
            self._pointer = landed
        return {}

    def _put_pointer(self, data: bytes, base: Pointer) -> str:
        if not self.conditional:
            return self.client.put(STEP_COUNT, data)
        if base.etag is None:
            return self.client.put(STEP_COUNT, data, if_none_match="*")
        return self.client.put(STEP_COUNT, data, if_match=base.etag)

    def _fresh_pointer(self) -> Pointer:
        got = self.client.get(STEP_COUNT, MAX_STEP_COUNT_BYTES)
        pointer = ABSENT if got is None else self._parse(got.data, got.etag)
        with self._lock:
            self._pointer = pointer
        return pointer

    def _check_no_other_master(
        self, base: Pointer, outer_step: int, master: str | None = None
    ) -> None:
        """A step count at or past ours that this process did not write is another master's,
        unless it names this master (``master``: its id, kept in its state_dir), started again:
        it republishes its own step at start (e.g. to take back a run's end, issue 55).

        A damaged or absent one is replaced (I3: the master restores what is behind or broken).
        """
        with self._lock:
            ours = base.sha in self._own
        ours = ours or (master is not None and (base.value or {}).get("master") == master)
        theirs = (base.value or {}).get("outer_step", -1)
        if not ours and theirs >= outer_step:
            raise TransportError(
                f"another master published outer step {theirs} to {self.describe()}; "
                "only one master may run",
                hint="stop the other master (or give this run its own prefix), then restart",
            )


def check_repo_path(path: str) -> str:
    """``path`` if it is a plain relative repo path (no '..', '.', empty or absolute parts)."""
    parts = path.split("/") if isinstance(path, str) else [""]
    if any(p in ("", ".", "..") or "\\" in p or "\x00" in p for p in parts):
        raise TransportError(f"refusing repo path {path!r}")
    return path


def _copy(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A private copy of a cached JSON value, so callers cannot change the cache."""
    return None if value is None else json.loads(json.dumps(value))

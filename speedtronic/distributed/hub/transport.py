"""The DumbDiLoCo ``Transport`` over a Hugging Face Hub repo, spending as few API calls as it can.

This module owns how the transport's operations map onto Hub commits and reads, and the small
caches that keep an idle node cheap: the last head seen, the last listing of ``nodes/`` (with
the revision each path was listed at) and the last ``step_count.json`` read (with its
revision). Every question starts with ``head()``, one call; only when the head moved does a
listing or a download follow, so an idle master poll costs at most 2 calls. Reads are pinned to
the revision their path was listed at (deltas) or whose step count was read (global weights),
so a step count and its weights always come from one commit. ``publish`` is one commit whose
parent is the last head seen, after checking that the step count there is one this node read
or wrote, so a second master is detected instead of overwritten. The HTTP side (retries,
budgets, ambiguous failures) is ``hub.HubClient``'s; no torch here.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from speedtronic.distributed.hub.budget import Budget, cadence_warnings, observed_commit_warning
from speedtronic.distributed.hub.errors import CommitConflict, HubError, RepoNotFound
from speedtronic.distributed.hub.files import git_blob_oid
from speedtronic.distributed.protocol import (
    GLOBAL_WEIGHTS,
    NODES_DIR,
    STEP_COUNT,
    delta_path_problem,
    parse_delta_path,
    parse_step_count,
)
from speedtronic.distributed.transport import MAX_STEP_COUNT_BYTES, DeltaRef
from speedtronic.errors import TransportError

MAX_PUBLISH_ATTEMPTS = 5  # commits refused because the head moved (workers' uploads), in a row
RATE_WARNING_EVERY_S = 3600.0  # an observed-rate warning is repeated at most this often


@dataclass(frozen=True)
class StepCountRead:
    """``step_count.json`` as read at ``head``: its parsed value (None: absent) or the error,
    and its git blob id."""

    head: str
    value: dict[str, Any] | None
    error: str | None = None
    oid: str | None = None


class HubTransport:
    """``Transport`` over ``client`` (a ``hub.HubClient``); shared by a node's threads.

    ``min_publish_interval_s`` is kept for the master, which spaces its publishes (the Hub
    allows ~128 commits an hour per repo); ``squash_every`` > 0 squashes the repo's history
    after every that many publishes, so old weights stop taking storage.
    """

    def __init__(
        self,
        client: Any,
        *,
        min_publish_interval_s: float = 60.0,
        squash_every: int = 0,
    ):
        self.client = client
        self.repo_id: str = client.repo_id
        self.node_id: str = client.node_id or ""  # names its commits and errors
        self.min_publish_interval_s = min_publish_interval_s
        self.squash_every = squash_every
        self._lock = threading.Lock()  # guards everything below; never held during a request
        self._head: str | None = None  # the head this transport saw or made last
        self._listing: tuple[str, list[DeltaRef]] | None = None  # (revision, refs)
        self._pins: dict[str, str] = {}  # delta path -> the revision it was listed at
        self._step: StepCountRead | None = None
        self._own_step_oids: set[str] = set()  # step_count.json versions read or published here
        self._warnings: list[str] = []
        # The commit rate as the master sees it: deltas first listed here (1 commit each, its
        # own local worker's too) and its publishes and squashes
        self._arrivals, self._publishes = Budget(client.budget.clock), Budget(client.budget.clock)
        self._inner_steps: int | None = None  # known after prepare()
        self._rate_warned_at: float | None = None
        self._counts = dict.fromkeys(
            ("uploads", "publishes", "publish_conflicts", "squashes", "squash_failures"), 0
        )

    def describe(self) -> str:
        return f"hf://{self.repo_id}"

    def stats(self) -> dict[str, int]:
        """The Hub budget counters plus this transport's own; numbers only (they are logged)."""
        with self._lock:
            counts = {f"hub_{name}": value for name, value in self._counts.items()}
        return {**self.client.budget.snapshot(), **counts}

    def take_warnings(self) -> list[str]:
        """One-line warnings (failed squashes, a commit rate near the Hub's limit) since the
        last call, for the caller to log."""
        rate = self._rate_warning()
        with self._lock:
            taken, self._warnings = self._warnings + ([rate] if rate else []), []
        return taken

    def _rate_warning(self) -> str | None:
        """The master's view of the fleet: the deltas it saw arrive plus its own publishes."""
        now, last = self._arrivals.clock(), self._rate_warned_at
        if self._inner_steps is None or (last is not None and now - last < RATE_WARNING_EVERY_S):
            return None
        message = observed_commit_warning(
            deltas_per_hour=self._arrivals.commits_per_hour(),
            publishes_per_hour=self._publishes.commits_per_hour(),
            inner_steps=self._inner_steps,
        )
        if message:
            self._rate_warned_at = now
            return f"{self.repo_id}: {message}"
        return None

    # ------------------------------------------------------------------ start-up

    def prepare(self, settings: Any, logger: Any) -> None:
        """Before training: a master creates a missing repo (private, as ``hub init``) and
        attempts the grants in ``collaborators``; every node checks that its token can write,
        so a refusal is one line at start rather than after an inner loop."""
        from speedtronic.distributed.hub.access import write_access_problem
        from speedtronic.distributed.hub.admin import grant, init_repo

        who = f"{self.node_id}: " if self.node_id else ""
        self._inner_steps = settings.inner_steps
        try:
            if self.client.visibility() is None:
                if settings.role != "master":
                    raise RepoNotFound(  # one line, the advice in it: no hint line under it
                        f"{who}{self.repo_id} not found (or not visible to this token): "
                        f"create it with speedtronic hub init {self.repo_id}",
                        permanent=True,
                    )
                init_repo(self.client)
                logger.notice(f"diloco master: created the private repo {self.repo_id}")
            problem = write_access_problem(self.client.whoami(), self.repo_id)
            if problem is not None:
                message = f"{who}token cannot write to {self.repo_id}: {problem}"
                raise HubError(message, status=403, permanent=True)
            if settings.role == "master" and settings.collaborators:
                for line in grant(self.client, list(settings.collaborators)).instructions:
                    logger.warn(f"diloco master: {line}")
        except TransportError as exc:  # the Hub is down for now: training starts anyway (I5)
            if getattr(exc, "permanent", False):
                raise
            logger.warn(f"diloco: could not check {self.repo_id} at start ({exc}); going on")

    def cadence_warnings(self, settings: Any, step_time_s: float | None) -> list[str]:
        """Where the configured cadence would exceed the Hub's budgets, naming the knob."""
        nodes = len((self._step.value or {}).get("nodes") or {}) if self._step else 0
        return cadence_warnings(
            nodes=max(nodes, 1),
            inner_steps=settings.inner_steps,
            step_time_s=step_time_s,
            poll_interval_s=settings.poll_interval,
            min_publish_interval_s=self.min_publish_interval_s,
        )

    # ------------------------------------------------------------------ workers

    def upload(self, path: str, data: bytes) -> None:
        """One commit adding ``path``; raises only when it did not land (the client checks)."""
        check_repo_path(path)
        parsed = parse_delta_path(path)
        what = f"delta {parsed[1]}" if parsed else f"upload {path}"
        head = self.client.commit({path: data}, [], self._message(what))
        with self._lock:
            self._head = head
            self._counts["uploads"] += 1

    # ------------------------------------------------------------------ reads

    def list_deltas(self) -> list[DeltaRef]:
        """The deltas under ``nodes/`` at the current head: 1 call if nothing changed, else 2."""
        head = self._current_head()
        with self._lock:
            if self._listing is not None and self._listing[0] == head:
                return list(self._listing[1])
        files = self.client.list_files(NODES_DIR, head)
        refs = sorted(
            (DeltaRef(f.path, f.size, f.oid, delta_path_problem(f.path)) for f in files),
            key=lambda r: r.path,
        )
        with self._lock:
            if self._listing is not None:  # the first listing holds the past, not arrivals
                before = {r.path for r in self._listing[1]}
                for _ in (r for r in refs if r.path not in before):
                    self._arrivals.count_commit()
            self._listing = (head, refs)
            self._pins = {r.path: head for r in refs}
        return list(refs)

    def read(self, path: str, max_bytes: int) -> bytes | None:
        """``path`` at the revision it was listed at (global files: where the step count was
        read), else at the current head. None when absent there."""
        check_repo_path(path)
        with self._lock:
            if path in (GLOBAL_WEIGHTS, STEP_COUNT):
                revision = self._step.head if self._step is not None else None
            else:
                revision = self._pins.get(path)
        if revision is None:
            revision = self._current_head()
        try:
            return self.client.download(path, revision, max_bytes)
        except HubError as exc:
            if exc.status == 404:  # the pinned revision was squashed away: start afresh
                self._forget()
            raise

    def _forget(self) -> None:
        """Drop every cached head, listing, pin and step count (their revisions are gone)."""
        with self._lock:
            self._head, self._listing, self._pins, self._step = None, None, {}, None

    def read_step_count(self) -> dict[str, Any] | None:
        """``step_count.json`` at the current head; the cached value (1 call) if unchanged."""
        head = self._current_head()
        with self._lock:
            cached = self._step if self._step is not None and self._step.head == head else None
        if cached is None:
            cached = self._read_step_count_at(head)
            with self._lock:
                self._step = cached
                if cached.oid is not None:  # seen by this node: not a stranger's publish
                    self._own_step_oids.add(cached.oid)
        if cached.error is not None:
            raise TransportError(cached.error)
        return _copy(cached.value)

    def _read_step_count_at(self, revision: str) -> StepCountRead:
        data = self.client.download(STEP_COUNT, revision, MAX_STEP_COUNT_BYTES)
        if data is None:
            return StepCountRead(revision, None)
        oid = git_blob_oid(data)
        try:
            return StepCountRead(revision, parse_step_count(data), oid=oid)
        except TransportError as exc:
            return StepCountRead(revision, None, f"{self.repo_id}: {exc}", oid)

    # ------------------------------------------------------------------ the master

    def publish(self, weights: bytes, step_count: dict[str, Any], consumed: list[str]) -> None:
        """One commit: the weights, ``step_count.json`` and deletes of the consumed deltas.

        Its parent is the last head seen, whose step count must be one this node read or wrote
        or else behind ours (another master at or past our outer step is an error). When the
        head moved under it (workers' uploads) the commit is refused (412) and rebuilt on the
        new head with the same check, a bounded number of times.
        """
        outer_step = step_count["outer_step"]
        body = json.dumps(step_count, indent=2).encode() + b"\n"
        adds = {GLOBAL_WEIGHTS: weights, STEP_COUNT: body}
        message = self._message(f"publish outer step {outer_step}")
        with self._lock:
            parent = self._head
            # a retried commit of ours may land late: its step count is not another master's
            self._own_step_oids.add(git_blob_oid(body))
        if parent is None:
            parent = self._current_head()
        for _ in range(MAX_PUBLISH_ATTEMPTS):
            deletes = self._deletable(parent, outer_step, consumed)
            try:
                head = self.client.commit(adds, deletes, message, parent=parent)
            except CommitConflict:
                with self._lock:
                    self._counts["publish_conflicts"] += 1
                parent = self._current_head()
                continue
            self._published(parent, head, body, deletes)
            self._squash_if_due(outer_step)
            return
        raise TransportError(
            f"could not publish outer step {outer_step} to {self.repo_id}: the repo changed "
            f"under {MAX_PUBLISH_ATTEMPTS} commits in a row; the next round tries again"
        )

    def _deletable(self, parent: str, outer_step: int, consumed: list[str]) -> list[str]:
        """Consumed paths present at ``parent``, after checking no other master published there.

        One ``paths_info`` call answers both: the step count's version (one we read or wrote
        means no other master; any other is downloaded and compared) and which deltas exist.
        """
        wanted = [p for p in dict.fromkeys(consumed) if p not in (GLOBAL_WEIGHTS, STEP_COUNT)]
        for path in wanted:
            check_repo_path(path)
        found = self.client.paths_info([STEP_COUNT, *wanted], parent)
        counted = found.get(STEP_COUNT)
        with self._lock:
            known = counted is None or counted.oid in self._own_step_oids
        if not known:
            self._check_no_other_master(parent, outer_step)
        return [p for p in wanted if p in found]

    def _check_no_other_master(self, revision: str, outer_step: int) -> None:
        theirs = self._read_step_count_at(revision)
        if theirs.value is not None and theirs.value["outer_step"] >= outer_step:
            raise TransportError(
                f"another master published outer step {theirs.value['outer_step']} to "
                f"{self.repo_id}; only one master may run",
                hint="stop the other master (or give this run its own repo), then restart",
            )
        if theirs.oid is not None:
            with self._lock:
                self._own_step_oids.add(theirs.oid)

    def _published(self, parent: str, head: str, body: bytes, deletes: list[str]) -> None:
        """Caches after our own commit: its step count is ours; the listing loses the deletes."""
        gone = set(deletes)
        with self._lock:
            self._head = head
            self._step = StepCountRead(head, json.loads(body), oid=git_blob_oid(body))
            self._own_step_oids = {git_blob_oid(body)}
            if self._listing is not None and self._listing[0] == parent:
                # Nothing else changed between parent and head: no need to list again
                self._listing = (head, [r for r in self._listing[1] if r.path not in gone])
                self._pins = {p: rev for p, rev in self._pins.items() if p not in gone}
            self._counts["publishes"] += 1
        self._publishes.count_commit()

    def _squash_if_due(self, outer_step: int) -> None:
        with self._lock:
            due = self.squash_every > 0 and self._counts["publishes"] % self.squash_every == 0
        if not due:
            return
        try:
            self.client.squash(self._message(f"squash history at outer step {outer_step}"))
        except (TransportError, OSError) as exc:
            # The publish landed; an unsquashed history only costs storage until the next try
            with self._lock:
                self._counts["squash_failures"] += 1
                self._warnings.append(f"{self.repo_id}: history squash failed ({exc})")
            return
        self._forget()  # squashing rewrites every commit: the revisions cached are gone
        self._publishes.count_commit()
        with self._lock:
            self._counts["squashes"] += 1

    # ------------------------------------------------------------------ helpers

    def _current_head(self) -> str:
        head = self.client.head()
        with self._lock:
            self._head = head
        return head

    def _message(self, what: str) -> str:
        return f"{self.node_id}: {what}" if self.node_id else what


def check_repo_path(path: str) -> str:
    """``path`` if it is a plain relative repo path (no '..', '.', empty or absolute parts)."""
    parts = path.split("/") if isinstance(path, str) else [""]
    if any(p in ("", ".", "..") or "\\" in p or "\x00" in p for p in parts):
        raise TransportError(f"refusing repo path {path!r}")
    return path


def _copy(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A private copy of a cached JSON value, so callers cannot change the cache."""
    return None if value is None else json.loads(json.dumps(value))

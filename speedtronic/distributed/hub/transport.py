"""The DumbDiLoCo ``Transport`` over a Hugging Face Hub repo, spending as few API calls as it can.

This module owns how the transport's operations map onto Hub commits and reads. Every question
starts with ``head()``, one call; only when the head moved does a listing or a download follow
(``view.RepoView`` keeps what was seen), so an idle master poll costs at most 2 calls. Reads
are pinned to the revision their path was listed at (deltas) or whose step count was read
(global weights), so a step count and its weights always come from one commit. The master's
publish is ``publish.Publisher``'s, the commit rate it watches ``rates.CommitRates``'; the HTTP
side (retries, budgets, ambiguous failures) is ``client.HubClient``'s. No torch here.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from speedtronic.distributed.hub.cadence import settings_warnings
from speedtronic.distributed.hub.publish import MAX_PUBLISH_ATTEMPTS, Publisher, commit_message
from speedtronic.distributed.hub.rates import CommitRates
from speedtronic.distributed.hub.view import RepoView, Tally, read_step_count_at
from speedtronic.distributed.protocol import NODES_DIR, delta_path_problem, parse_delta_path
from speedtronic.distributed.transport import DeltaRef
from speedtronic.errors import DamagedRepoFile
from speedtronic.hub.errors import HubError
from speedtronic.hub.files import check_repo_path

__all__ = ["MAX_PUBLISH_ATTEMPTS", "HubTransport", "check_repo_path"]


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
        self.view = RepoView()
        self.rates = CommitRates(self.repo_id, client.budget.clock)
        names = ("uploads", "publishes", "publish_conflicts", "squashes", "squash_failures")
        self.counts = Tally(*names)
        self._lock = threading.Lock()  # guards the warnings
        self._warnings: list[str] = []
        self._publisher = Publisher(
            client, self.view, self.counts, self.rates, self._warn, squash_every
        )

    def describe(self) -> str:
        return f"hf://{self.repo_id}"

    def stats(self) -> dict[str, int]:
        """The Hub budget counters plus this transport's own; numbers only (they are logged)."""
        counts = {f"hub_{name}": value for name, value in self.counts.snapshot().items()}
        return {**self.client.budget.snapshot(), **counts}

    def take_warnings(self) -> list[str]:
        """One-line warnings (failed squashes, a commit rate near the Hub's limit) since the
        last call, for the caller to log."""
        rate = self.rates.warning()
        with self._lock:
            taken, self._warnings = self._warnings + ([rate] if rate else []), []
        return taken

    def _warn(self, line: str) -> None:
        with self._lock:
            self._warnings.append(line)

    # ------------------------------------------------------------------ start-up

    def prepare(self, settings: Any, logger: Any) -> None:
        """Before training: create (a master) and check the repo (``prepare.prepare_node``)."""
        from speedtronic.distributed.hub.prepare import prepare_node

        self.rates.inner_steps = settings.inner_steps
        prepare_node(self.client, settings, logger)

    def cadence_warnings(self, settings: Any, step_time_s: float | None) -> list[str]:
        """Where the configured cadence would exceed the Hub's budgets, naming the knob."""
        step = self.view.step
        nodes = len((step.value or {}).get("nodes") or {}) if step else 0
        return settings_warnings(
            settings,
            nodes=max(nodes, 1),
            step_time_s=step_time_s,
            min_publish_interval_s=self.min_publish_interval_s,
        )

    # ------------------------------------------------------------------ workers

    def upload(self, path: str, data: bytes) -> None:
        """One commit adding ``path``; raises only when it did not land (the client checks)."""
        check_repo_path(path)
        parsed = parse_delta_path(path)
        what = f"delta {parsed[1]}" if parsed else f"upload {path}"
        self.view.saw_head(self.client.commit({path: data}, [], commit_message(self.node_id, what)))
        self.counts.add("uploads")

    # ------------------------------------------------------------------ reads

    def list_deltas(self) -> list[DeltaRef]:
        """The deltas under ``nodes/`` at the current head: 1 call if nothing changed, else 2."""
        head = self.view.current_head(self.client)
        cached = self.view.listing_at(head)
        if cached is not None:
            return cached
        files = self.client.list_files(NODES_DIR, head)
        refs = sorted(
            (DeltaRef(f.path, f.size, f.oid, delta_path_problem(f.path)) for f in files),
            key=lambda r: r.path,
        )
        self.rates.arrived(self.view.store_listing(head, refs))
        return list(refs)

    def read(self, path: str, max_bytes: int) -> bytes | None:
        """``path`` at the revision it was listed at (global files: where the step count was
        read), else at the current head. None when absent there."""
        check_repo_path(path)
        revision = self.view.revision_of(path) or self.view.current_head(self.client)
        try:
            return self.client.download(path, revision, max_bytes)
        except HubError as exc:
            if exc.status == 404:  # the pinned revision was squashed away: start afresh
                self.view.forget()
            raise

    def file_version(self, path: str) -> str | None:
        """``path``'s blob id at the current head (it changes with the bytes), None if absent:
        one call, where reading a keyframe to check it would download the full weights."""
        check_repo_path(path)
        found = self.client.paths_info([path], self.view.current_head(self.client)).get(path)
        return None if found is None else found.oid

    def read_step_count(self) -> dict[str, Any] | None:
        """``step_count.json`` at the current head; the cached value (1 call) if unchanged."""
        head = self.view.current_head(self.client)
        cached = self.view.step_at(head)
        if cached is None:
            cached = read_step_count_at(self.client, head)
            self.view.store_step(cached)
        if cached.error is not None:  # the repo answered; the file is what is wrong
            raise DamagedRepoFile(cached.error)
        return _copy(cached.value)

    # ------------------------------------------------------------------ the master

    def publish(self, weights: bytes, step_count: dict[str, Any], consumed: list[str]) -> None:
        """One commit: the weights, ``step_count.json`` and deletes of the consumed deltas, on
        the last head seen, refusing to overwrite another master's (``publish.Publisher``)."""
        self._publisher.publish(weights, step_count, consumed)


def _copy(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A private copy of a cached JSON value, so callers cannot change the cache."""
    return None if value is None else json.loads(json.dumps(value))

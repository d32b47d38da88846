"""An in-memory stand-in for ``speedtronic.distributed.hub.HubClient``, for fast unit tests.

``FakeHub`` is the server: repos whose history is a list of full snapshots (sha, time, title,
files), users and orgs. ``FakeHubClient`` has exactly HubClient's methods over it, counts
every call (``calls``, and its ``budget``), and behaves as HubClient promises: ``commit``
with a stale ``parent`` raises CommitConflict, deleting a missing file or reading a revision
that a squash removed is a HubError, oversize downloads are refused. Hooks inject faults:
``fail(method, error)`` raises before the call does anything, ``before(method, fn)`` runs
``fn`` first (e.g. another node's commit, to make a race), ``ambiguous(landed)`` makes the
next commit fail ambiguously, resolved the way HubClient resolves it (extra calls, no double
commit), and ``lost()`` makes the next commit land and still raise what HubClient raises when
it could not find it (``maybe_landed``). Several clients may share one ``FakeHub``, like nodes
sharing a repo.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedtronic.hub.budget import Budget
from speedtronic.hub.errors import CommitConflict, HubError, RepoNotFound
from speedtronic.hub.files import HubCommit, HubFile, git_blob_oid


def hub_error(cls: type, message: str, status: int | None, permanent: bool) -> HubError:
    """One of hub.py's errors, as HubClient raises it."""
    return cls(message, status=status, permanent=permanent)


@dataclass
class FakeCommit:
    sha: str
    time: float
    title: str
    files: dict[str, bytes]


@dataclass
class FakeRepo:
    private: bool = True
    history: list[FakeCommit] = field(default_factory=list)  # oldest first

    @property
    def head(self) -> FakeCommit:
        return self.history[-1]

    @property
    def files(self) -> dict[str, bytes]:
        return dict(self.head.files)


class FakeHub:
    """The server side: repos, users, orgs, a clock. Thread-safe (one lock)."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.repos: dict[str, FakeRepo] = {}
        self.users: set[str] = {"alice"}
        self.orgs: dict[str, dict[str, str]] = {}
        self.lock = threading.RLock()
        self._shas = (hashlib.sha1(str(n).encode()).hexdigest() for n in itertools.count())

    def create(self, repo_id: str, private: bool = True) -> FakeRepo:
        with self.lock:
            if repo_id not in self.repos:
                repo = FakeRepo(private)
                repo.history.append(self._commit({".gitattributes": b"*.bin filter=lfs\n"}, "init"))
                self.repos[repo_id] = repo
            return self.repos[repo_id]

    def _commit(self, files: dict[str, bytes], title: str) -> FakeCommit:
        return FakeCommit(next(self._shas), self.clock(), title, files)

    def push(self, repo_id: str, adds: dict[str, bytes], deletes: list[str], title: str) -> str:
        """Commit straight to the server (another node, uncounted); the new head sha."""
        with self.lock:
            repo = self.repos[repo_id]
            files = dict(repo.head.files)
            for path in deletes:
                files.pop(path)
            files.update(adds)
            repo.history.append(self._commit(files, title))
            return repo.head.sha

    def squash(self, repo_id: str, title: str) -> None:
        with self.lock:
            repo = self.repos[repo_id]
            repo.history = [self._commit(dict(repo.head.files), title)]


class FakeHubClient:
    """HubClient's interface over a ``FakeHub``; ``calls`` lists the method of every call."""

    def __init__(
        self,
        repo_id: str,
        *,
        token: str | None = None,
        node_id: str = "",
        endpoint: str | None = None,
        cache_dir: str | Path | None = None,
        budget: Budget | None = None,
        max_attempts: int = 8,
        max_backoff_s: float = 60.0,
        timeout_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
        hub: FakeHub | None = None,
        user: str = "alice",
    ):
        self.repo_id, self.node_id, self.user = repo_id, node_id, user
        self.hub = hub if hub is not None else FakeHub()
        self.budget = budget if budget is not None else Budget()
        self.calls: list[str] = []
        self._faults: dict[str, list[Any]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ hooks

    def fail(self, method: str, error: Exception, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` raise ``error`` (counted as calls)."""
        with self._lock:
            self._faults.setdefault(method, []).extend([error] * times)

    def before(self, method: str, fn: Callable[[], Any]) -> None:
        """Run ``fn`` at the start of the next call of ``method`` (to stage a race)."""
        with self._lock:
            self._faults.setdefault(method, []).append(fn)

    def ambiguous(self, landed: bool) -> None:
        """The next commit times out after sending; ``landed``: it was applied anyway."""
        with self._lock:
            self._faults.setdefault("commit", []).append(("ambiguous", landed))

    def lost(self) -> None:
        """The next commit lands, but its answer is lost and the landing not yet visible
        when looked for: HubClient's ``maybe_landed`` error."""
        with self._lock:
            self._faults.setdefault("commit", []).append(("lost",))

    def count(self, method: str | None = None) -> int:
        return len(self.calls) if method is None else self.calls.count(method)

    def _call(self, method: str) -> Any:
        """Count one API call of ``method``; raise or run its injected fault, if any."""
        with self._lock:
            fault = self._faults.get(method, []).pop(0) if self._faults.get(method) else None
            self.calls.append(method)
        self.budget.count_call()
        if isinstance(fault, Exception):
            raise fault
        if callable(fault):
            fault()
            return None
        return fault

    def _repo(self) -> FakeRepo:
        repo = self.hub.repos.get(self.repo_id)
        if repo is None:
            raise hub_error(
                RepoNotFound, f"{self.repo_id}: repo not found", status=404, permanent=True
            )
        return repo

    def _snapshot(self, revision: str) -> dict[str, bytes]:
        with self.hub.lock:
            for commit in self._repo().history:
                if commit.sha == revision:
                    return commit.files
        raise hub_error(
            HubError, f"{self.repo_id}: revision {revision} not found", status=404, permanent=True
        )

    # ------------------------------------------------------------------ account and repo

    def whoami(self) -> dict:
        self._call("whoami")
        orgs = [o for o, members in self.hub.orgs.items() if self.user in members]
        roles = {o: self.hub.orgs[o][self.user] for o in orgs}
        return {
            "name": self.user,
            "orgs": orgs,
            "org_roles": roles,
            "token_role": "write",
            "fine_grained": {},
        }

    def visibility(self) -> bool | None:
        self._call("visibility")
        repo = self.hub.repos.get(self.repo_id)
        return None if repo is None else repo.private

    def create_repo(self, private: bool = True) -> None:
        self._call("create_repo")
        self.hub.create(self.repo_id, private)

    def set_private(self, private: bool) -> None:
        self._call("set_private")
        self._repo().private = private

    def user_exists(self, name: str) -> bool:
        self._call("user_exists")
        return name in self.hub.users

    def org_members(self, org: str) -> dict[str, str] | None:
        self._call("org_members")
        members = self.hub.orgs.get(org)
        return None if members is None else dict(members)

    # ------------------------------------------------------------------ reads

    def head(self) -> str:
        self._call("head")
        with self.hub.lock:
            return self._repo().head.sha

    def list_files(self, prefix: str, revision: str, with_times: bool = False) -> list[HubFile]:
        self._call("list_files")
        with self.hub.lock:
            files = self._snapshot(revision)
            when = self._repo().head.time if with_times else None
        start = prefix.rstrip("/") + "/"
        return [self._info(p, d, when) for p, d in sorted(files.items()) if p.startswith(start)]

    def paths_info(self, paths: list[str], revision: str) -> dict[str, HubFile]:
        self._call("paths_info")
        with self.hub.lock:
            files = self._snapshot(revision)
        return {p: self._info(p, files[p], None) for p in paths if p in files}

    @staticmethod
    def _info(path: str, data: bytes, modified: float | None) -> HubFile:
        return HubFile(
            path=path, size=len(data), oid=git_blob_oid(data), sha256=None, modified=modified
        )

    def download(self, path: str, revision: str, max_bytes: int) -> bytes | None:
        self._call("download")
        with self.hub.lock:
            data = self._snapshot(revision).get(path)
        if data is not None and len(data) > max_bytes:
            raise hub_error(
                HubError,
                f"{self.repo_id}: {path} is {len(data)} bytes, over the {max_bytes} cap",
                status=None,
                permanent=True,
            )
        return data

    def commits(self, since: float | None = None) -> list[HubCommit]:
        self._call("commits")
        with self.hub.lock:
            history = list(self._repo().history)
        return [
            HubCommit(sha=c.sha, time=c.time, title=c.title)
            for c in reversed(history)
            if since is None or c.time >= since
        ]

    def storage_bytes(self) -> int | None:
        self._call("storage_bytes")
        with self.hub.lock:
            blobs = {
                git_blob_oid(d): len(d) for c in self._repo().history for d in c.files.values()
            }
        return sum(blobs.values())

    # ------------------------------------------------------------------ writes

    def commit(
        self,
        adds: dict[str, bytes],
        deletes: list[str],
        message: str,
        parent: str | None = None,
    ) -> str:
        fault = self._call("commit")
        if fault == ("lost",):
            self._apply(adds, deletes, message, parent)
            self._call("commits")
            error = hub_error(HubError, f"{self.repo_id}: commit answer lost", None, False)
            error.maybe_landed = True
            raise error
        if isinstance(fault, tuple):  # ambiguous: HubClient checks whether it landed
            landed = fault[1]
            sha = self._apply(adds, deletes, message, parent) if landed else None
            self._call("commits")  # looked for by its id in main's history: one page
            if landed:
                self.budget.count_commit()
                return sha
            self._call("commit")  # it did not land: sent again
        self.budget.count_commit()
        return self._apply(adds, deletes, message, parent)

    def _apply(self, adds: dict[str, bytes], deletes: list[str], message: str, parent: str | None):
        with self.hub.lock:
            repo = self._repo()
            if parent is not None and parent != repo.head.sha:
                raise hub_error(
                    CommitConflict,
                    f"{self.repo_id}: parent commit {parent[:8]} is not the head any more (412)",
                    status=412,
                    permanent=False,
                )
            missing = [p for p in deletes if p not in repo.head.files]
            if missing:
                raise hub_error(
                    HubError,
                    f"{self.repo_id}: cannot delete {missing[0]}: not found (404)",
                    status=404,
                    permanent=True,
                )
            return self.hub.push(self.repo_id, adds, deletes, message)

    def squash(self, message: str) -> None:
        self._call("squash")
        self._repo()
        self.hub.squash(self.repo_id, message)

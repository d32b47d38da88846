"""``HubClient``: one Hub repo for one process (a DiLoCo node, a download, an upload).

The front of ``hub/``.

It owns the operations (the account, the repo, its files, its history) and puts their parts
together: every call runs under ``policy.RequestPolicy`` (session hooks that count requests and
time them out, retries with backoff, one-line errors by ``classify.Classifier``), reads are
``reads.Reads``' single requests, commits are ``commits.Commits``' (a lost answer is looked for
before a commit is repeated), and downloaded globals are kept in ``cache.DownloadCache``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

from huggingface_hub import get_token
from huggingface_hub import utils as hf_utils
from huggingface_hub.hf_api import RepoFile

from speedtronic.hub.access import token_facts
from speedtronic.hub.budget import Budget
from speedtronic.hub.cache import DownloadCache
from speedtronic.hub.classify import Missing
from speedtronic.hub.commits import COMMIT_ID_KEY, Commits
from speedtronic.hub.errors import HubError, RepoNotFound
from speedtronic.hub.files import HubCommit, HubFile
from speedtronic.hub.reads import connect, hub_file
from speedtronic.hub.wording import Op, Wording

__all__ = ["COMMIT_ID_KEY", "HubClient", "HubError", "RepoNotFound"]


class HubClient:
    """One repo on the Hub, for one node. Thread-safe: a node's threads share one."""

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
    ):
        self.repo_id, self.node_id = repo_id, node_id
        self.budget = budget if budget is not None else Budget()
        wording = Wording(node_id, token, get_token)
        limits = {"max_attempts": max_attempts, "max_backoff_s": max_backoff_s, "sleep": sleep}
        self.policy, self.reads = connect(
            repo_id, wording, endpoint, token, self.budget, timeout_s=timeout_s, **limits
        )
        self.endpoint = self.reads.endpoint
        self._commits = Commits(self.reads, self.policy)
        self._cache = DownloadCache(repo_id, node_id, cache_dir)  # .root: where files go

    @property
    def max_attempts(self) -> int:
        return self.policy.max_attempts

    @property
    def max_backoff_s(self) -> float:
        return self.policy.max_backoff_s

    @property
    def timeout_s(self) -> float:
        return self.policy.timeout_s

    def __repr__(self) -> str:  # never the token
        return f"HubClient({self.repo_id!r}, node_id={self.node_id!r}, endpoint={self.endpoint!r})"

    # -- account and repo ---------------------------------------------------------------------

    def whoami(self) -> dict:
        """The token's user, orgs and roles, kind and scopes (``access.token_facts``)."""
        op = Op("cannot identify the token at", self.endpoint)
        return token_facts(self._run(op, self.reads.api.whoami))

    def visibility(self) -> bool | None:
        """True private, False public, None: the repo is missing (or invisible to the token)."""
        try:
            return bool(
                self._run(self._op("cannot read"), lambda: self.reads.info("private")).private
            )
        except RepoNotFound:
            return None

    def create_repo(self, private: bool = True) -> None:
        op, create = self._op("cannot create", write=True), self.reads.api.create_repo
        self._run(op, lambda: create(self.repo_id, private=private, exist_ok=True))

    def set_private(self, private: bool) -> None:
        update = self.reads.api.update_repo_settings
        self._run(self._op("cannot set", write=True), lambda: update(self.repo_id, private=private))

    def head(self) -> str:
        """main's commit sha: one request. RepoNotFound if the repo is missing."""
        return self._run(self._op("cannot read"), self.reads.head)

    def storage_bytes(self) -> int | None:
        return self._run(
            self._op("cannot read"), lambda: self.reads.info("usedStorage")
        ).used_storage

    def user_exists(self, name: str) -> bool:
        op, overview = Op("cannot look up", f"user {name}"), self.reads.api.get_user_overview
        try:
            self._run(op, lambda: overview(name))
        except HubError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def org_members(self, org: str) -> dict[str, str] | None:
        """user -> role ("unknown" where the Hub hides roles); None if ``org`` is no org."""
        url = f"{self.endpoint}/api/organizations/{quote(org, safe='')}/members"
        try:
            pages = list(self._pages(Op("cannot list the members of", f"org {org}"), url, None))
        except HubError as exc:
            if exc.status == 404:
                return None
            raise
        return {item["user"]: item.get("role") or "unknown" for page in pages for item in page}

    # -- files --------------------------------------------------------------------------------

    def list_files(self, prefix: str, revision: str, with_times: bool = False) -> list[HubFile]:
        """Files under ``prefix`` at ``revision``, recursively; [] when the prefix is absent."""
        url = f"{self.endpoint}/api/models/{self.repo_id}/tree/{quote(revision, safe='')}"
        if prefix.strip("/"):
            url += "/" + quote(prefix.strip("/"), safe="")
        params = {"recursive": "true", "expand": "true" if with_times else "false"}
        try:
            pages = list(self._pages(self._op("cannot list files of"), url, params))
        except Missing:
            return []
        return [hub_file(RepoFile(**e)) for page in pages for e in page if e["type"] == "file"]

    def paths_info(self, paths: list[str], revision: str) -> dict[str, HubFile]:
        """The files among ``paths`` at ``revision``; missing paths (and folders) are absent."""
        return self._run(self._op("cannot read"), lambda: self.reads.paths_info(paths, revision))

    def download(self, path: str, revision: str, max_bytes: int) -> bytes | None:
        """``path``'s bytes at ``revision``, None if absent: one request, the size checked from
        the headers before the body; a short body is retried. ``global/`` files are cached."""
        cached = self._cache.read(path, revision, max_bytes)
        if cached is not None:
            return cached
        op = self._op(f"cannot download {path} at {revision[:12]} from")
        try:
            data = self._run(op, lambda: self.reads.fetch(path, revision, max_bytes))
        except Missing:
            return None
        self._cache.store(path, revision, data)
        return data

    # -- history ------------------------------------------------------------------------------

    def commit(self, adds: dict[str, bytes], deletes: list[str], message: str, parent=None) -> str:
        """One commit of ``adds`` and ``deletes`` to main; returns the new head sha. A lost
        answer is looked for before the commit is repeated; a 412 on ``parent`` is
        ``CommitConflict`` (``commits.Commits``)."""
        if not adds and not deletes:
            return self.head()
        return self._commits.commit(adds, deletes, message, parent)

    def commits(self, since: float | None = None) -> list[HubCommit]:
        """main's commits, newest first; only those at or after ``since`` (pages stop there)."""
        url = f"{self.endpoint}/api/models/{self.repo_id}/commits/main"
        out: list[HubCommit] = []
        for page in self._pages(self._op("cannot list commits of"), url, None):
            for item in page:
                when = hf_utils.parse_datetime(item["date"]).timestamp()
                if since is not None and when < since:
                    return out
                out.append(HubCommit(item["id"], when, item.get("title", "")))
        return out

    def squash(self, message: str) -> None:
        """Squash main's history into one commit (old blobs stop taking storage)."""
        op, squash = self._op("cannot squash", write=True), self.reads.api.super_squash_history
        self._run(op, lambda: squash(self.repo_id, branch="main", commit_message=message))
        self.budget.count_commit()

    # -- helpers ------------------------------------------------------------------------------

    def _op(self, what: str, write: bool = False) -> Op:
        return Op(what, self.repo_id, write)

    def _run(self, op: Op, fn):
        return self.policy.run(op, fn)

    def _pages(self, op: Op, url: str, params) -> Iterator[list]:
        """A paginated listing, one retried request per page (``Link: rel="next"``)."""
        next_url: str | None = url
        while next_url:
            page, next_url = self._run(op, lambda u=next_url, p=params: self.reads.page(u, p))
            params = None  # the next link carries the query
            yield page

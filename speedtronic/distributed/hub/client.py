"""The Hugging Face Hub as DiLoCo needs it; the only module that imports ``huggingface_hub``.

``HubClient`` owns the requests to one repo and the failure policy, in one place (``_run``):
timeouts, dropped connections, 5xx and 429 are retried with backoff and full jitter, or after
the wait the server asks for; 400/401/403/404 fail at once in one line; 412 is
``CommitConflict``. A commit whose answer was lost is looked for before it is repeated. Hooks
on the library's shared session count each request in the ``Budget``, give it the timeout and
stop the library's own 5xx/429 retries; listings and downloads are single requests here, as
``paginate`` and ``hf_hub_download`` would retry (and sleep) on their own.
"""

from __future__ import annotations

import contextvars
import logging
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

import httpx2
import tenacity
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, get_token, hf_hub_url
from huggingface_hub import errors as hf_errors
from huggingface_hub import utils as hf_utils
from huggingface_hub.hf_api import RepoFile

from speedtronic.distributed.hub.budget import Budget
from speedtronic.distributed.hub.cache import DownloadCache
from speedtronic.distributed.hub.errors import (
    CommitConflict,
    HubError,
    RepoNotFound,
    Transient,
    commit_request,
)
from speedtronic.distributed.hub.files import HubCommit, HubFile

T = TypeVar("T")
log = logging.getLogger("speedtronic.hub")
_NOT_SENT = (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)
_NETWORK = (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError)
_TOKEN_HINT = "set HF_TOKEN to a valid token, or run: hf auth login"
_WRITE_HINT = "use a token with write access to the repo (see: speedtronic hub grant)"
# In each commit's description: a lost commit is looked for by it (its files may be gone since)
COMMIT_ID_KEY = "speedtronic-commit-id"
_LOOKUP_SKEW_S = 600.0  # how much older than the first attempt the history is searched
_LOOKUP_PAGES = 10  # ... and at most this many pages of it (the commits endpoint pages by 50)


class _Missing(HubError):
    """404 EntryNotFound: no such path at that revision (callers answer None or [])."""


@dataclass(frozen=True)
class _Op:  # what a call is for, to word its errors: "<what> <subject> (<status>): <detail>"
    what: str
    subject: str
    write: bool = False


# Hooks on the library's session, for requests made inside a client's call: each is counted
# and gets the client's timeout, and a retryable status raises at once, so no retry loop of the
# library's (they sleep for real) runs under the client's.
_ACTIVE: contextvars.ContextVar[HubClient | None] = contextvars.ContextVar("hub", default=None)
_HOOK_LOCK = threading.Lock()


def _on_request(request: httpx2.Request) -> None:
    client = _ACTIVE.get()
    if client is not None:  # else someone else's request on the shared session
        client.budget.count_call()
        if all(v is None for v in (request.extensions.get("timeout") or {}).values()):
            request.extensions["timeout"] = httpx2.Timeout(client.timeout_s).as_dict()


def _on_response(response: httpx2.Response) -> None:
    status = response.status_code
    if _ACTIVE.get() is not None and (status in (408, 429) or status >= 500):
        hf_utils.hf_raise_for_status(response)  # ours to retry: stops the library's own loops


def _hook_session() -> None:
    """Make every session the library creates (it makes new ones after connection errors and
    forks) carry the hooks, through its client factory: one without them has no timeout."""
    with _HOOK_LOCK:
        if not _LIBRARY_HOOKS:
            hooks = hf_utils.get_session().event_hooks["request"]
            _LIBRARY_HOOKS.extend(h for h in hooks if h is not _on_request)
            hf_utils.set_client_factory(_hooked_client)  # the next get_session makes one


_LIBRARY_HOOKS: list = []  # the library's own request hooks, kept in our sessions


def _hooked_client() -> httpx2.Client:
    hooks = {"request": [*_LIBRARY_HOOKS, _on_request], "response": [_on_response]}
    return httpx2.Client(event_hooks=hooks, follow_redirects=True, timeout=None)


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
        self.max_attempts, self.max_backoff_s = max(1, max_attempts), max_backoff_s
        self.timeout_s, self._sleep = timeout_s, sleep
        self._token = token  # None: huggingface_hub resolves HF_TOKEN or the stored login
        self._api = HfApi(endpoint=endpoint, token=token, library_name="speedtronic")
        self.endpoint = self._api.endpoint.rstrip("/")
        self._cache = DownloadCache(repo_id, node_id, cache_dir)  # .root: where files go
        self._backoff = tenacity.wait_random_exponential(multiplier=1, max=max_backoff_s)

    def __repr__(self) -> str:  # never the token
        return f"HubClient({self.repo_id!r}, node_id={self.node_id!r}, endpoint={self.endpoint!r})"

    # -- account and repo ---------------------------------------------------------------------

    def whoami(self) -> dict:
        info = self._run(_Op("cannot identify the token at", self.endpoint), self._api.whoami)
        roles = {o["name"]: o.get("roleInOrg") for o in info.get("orgs") or [] if "name" in o}
        token = (info.get("auth") or {}).get("accessToken") or {}  # its kind, never its value
        return {
            "name": info.get("name", ""),
            "orgs": list(roles),
            "org_roles": roles,
            "token_role": token.get("role"),
            "fine_grained": token.get("fineGrained") or {},
        }

    def visibility(self) -> bool | None:
        """True private, False public, None: the repo is missing (or invisible to the token)."""
        try:
            return bool(self._run(self._op("cannot read"), lambda: self._info("private")).private)
        except RepoNotFound:
            return None

    def create_repo(self, private: bool = True) -> None:
        op, create = self._op("cannot create", write=True), self._api.create_repo
        self._run(op, lambda: create(self.repo_id, private=private, exist_ok=True))

    def set_private(self, private: bool) -> None:
        update = self._api.update_repo_settings
        self._run(self._op("cannot set", write=True), lambda: update(self.repo_id, private=private))

    def head(self) -> str:
        """main's commit sha: one request. RepoNotFound if the repo is missing."""
        return self._run(self._op("cannot read"), self._head_once)

    def storage_bytes(self) -> int | None:
        return self._run(self._op("cannot read"), lambda: self._info("usedStorage")).used_storage

    def user_exists(self, name: str) -> bool:
        op, overview = _Op("cannot look up", f"user {name}"), self._api.get_user_overview
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
            pages = list(self._pages(_Op("cannot list the members of", f"org {org}"), url, None))
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
        except _Missing:
            return []
        return [_hub_file(RepoFile(**e)) for page in pages for e in page if e["type"] == "file"]

    def paths_info(self, paths: list[str], revision: str) -> dict[str, HubFile]:
        """The files among ``paths`` at ``revision``; missing paths (and folders) are absent."""
        return self._run(self._op("cannot read"), lambda: self._paths_info_once(paths, revision))

    def download(self, path: str, revision: str, max_bytes: int) -> bytes | None:
        """``path``'s bytes at ``revision``, None if absent: one request, the size checked from
        the headers before the body; a short body is retried. ``global/`` files are cached."""
        cached = self._cache.read(path, revision, max_bytes)
        if cached is not None:
            return cached
        op = self._op(f"cannot download {path} at {revision[:12]} from")
        try:
            data = self._run(op, lambda: self._fetch(path, revision, max_bytes))
        except _Missing:
            return None
        self._cache.store(path, revision, data)
        return data

    # -- history ------------------------------------------------------------------------------

    def commit(self, adds: dict[str, bytes], deletes: list[str], message: str, parent=None) -> str:
        """One commit of ``adds`` and ``deletes`` to main; returns the new head sha.

        When an attempt's answer is lost (5xx, timeout, dropped connection after sending), the
        next one first looks for the commit in main's recent history by the random id in its
        description and returns its sha if it landed; the repeat is sent with the head just
        seen as parent, so a late landing shows up as a 412 (looked for again), never as a
        second commit. Otherwise a 412 on the caller's ``parent`` is ``CommitConflict``.
        """
        if not adds and not deletes:
            return self.head()
        op = self._op("cannot commit to", write=True)
        pin = {"parent": parent, "lost": False, "check": False}  # lost: ever; check: pending
        commit_id, started = secrets.token_hex(12), time.time()
        description = f"{COMMIT_ID_KEY}: {commit_id}"

        def attempt() -> str:
            if pin["check"]:
                landed, head = self._landed(commit_id, started)
                if landed:
                    self.budget.count_commit()
                    return landed
                if parent is not None and head != parent:
                    moved = self._msg(op, 412, f"main is at {head[:12]} now", "commit conflict on")
                    raise CommitConflict(moved, status=412)
                pin["parent"], pin["check"] = head, False
            try:
                sha = self._commit_once(adds, deletes, message, description, pin["parent"])
            except Exception as exc:
                err = self._classify(exc, op)
                if isinstance(err, CommitConflict) and pin["lost"]:  # ours, landing late?
                    err = Transient(412, "the head moved", ambiguous=True)
                if isinstance(err, Transient) and err.ambiguous:
                    pin["lost"] = pin["check"] = True
                raise err from exc
            self.budget.count_commit()
            return sha

        try:
            return self._run(op, attempt)
        except HubError as exc:
            if not pin["lost"]:
                raise
            landed = self._run(self._op("cannot read"), lambda: self._landed(commit_id, started))[0]
            if landed is None:  # still unknown: the caller must send these same bytes again
                exc.maybe_landed = True
                raise
            self.budget.count_commit()
            return landed

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
        op, squash = self._op("cannot squash", write=True), self._api.super_squash_history
        self._run(op, lambda: squash(self.repo_id, branch="main", commit_message=message))
        self.budget.count_commit()

    # -- single requests (no retry of their own) ----------------------------------------------

    def _info(self, field: str):
        return self._api.model_info(self.repo_id, expand=[field], timeout=self.timeout_s)

    def _head_once(self) -> str:
        return self._info("sha").sha  # expand=["sha"]: the cheapest answer that names it

    def _paths_info_once(self, paths: list[str], revision: str) -> dict[str, HubFile]:
        entries = self._api.get_paths_info(self.repo_id, list(paths), revision=revision)
        return {e.path: _hub_file(e) for e in entries if isinstance(e, RepoFile)}

    def _commit_once(self, adds, deletes, message: str, description: str, parent) -> str:
        # Fresh operation objects each attempt: the library marks them as used.
        ops: list = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=d) for p, d in adds.items()]
        ops += [CommitOperationDelete(path_in_repo=p) for p in deletes]
        return self._api.create_commit(
            self.repo_id,
            ops,
            commit_message=message,
            commit_description=description,
            parent_commit=parent,
        ).oid

    def _landed(self, commit_id: str, since: float) -> tuple[str | None, str]:
        """(sha of the commit carrying ``commit_id`` or None, main's head), from main's history
        back to ``since`` less a margin for clock skew; usually one request."""
        url: str | None = f"{self.endpoint}/api/models/{self.repo_id}/commits/main"
        head, pages = None, 0
        while url and pages < _LOOKUP_PAGES:
            (page, url), pages = self._page_once(url, None), pages + 1
            for item in page:
                head = head or item["id"]
                if commit_id in f"{item.get('title', '')}\n{item.get('message') or ''}":
                    return item["id"], head
                if hf_utils.parse_datetime(item["date"]).timestamp() < since - _LOOKUP_SKEW_S:
                    return None, head
        return None, head or self._head_once()

    def _fetch(self, path: str, revision: str, max_bytes: int) -> bytes:
        url = hf_hub_url(self.repo_id, path, revision=revision, endpoint=self.endpoint)
        headers = hf_utils.build_hf_headers(token=self._token, library_name="speedtronic")
        headers["Accept-Encoding"] = "identity"  # Content-Length is then the body's true size
        session = hf_utils.get_session()
        with session.stream("GET", url, headers=headers, timeout=self.timeout_s) as response:
            hf_utils.hf_raise_for_status(response)
            length = response.headers.get("Content-Length", "")
            size = int(length) if length.isdigit() else None
            data = bytearray()
            if size is None or size <= max_bytes:  # else refused before reading the body
                for chunk in response.iter_bytes():
                    data += chunk
                    if len(data) > max_bytes:
                        break
        if (found := max(len(data), size or 0)) > max_bytes:  # a bad file, not a bad node
            detail = f"{found} bytes, over the {max_bytes} byte cap; not downloaded"
            raise HubError(
                self._msg(_Op(f"{path} at {revision[:12]} in", self.repo_id), 413, detail)
            )
        if size is not None and len(data) != size:
            raise Transient(None, f"truncated download of {path}: {len(data)} of {size} bytes")
        return bytes(data)

    def _pages(self, op: _Op, url: str, params) -> Iterator[list]:
        """A paginated listing, one retried request per page (``Link: rel="next"``)."""
        next_url: str | None = url
        while next_url:
            page, next_url = self._run(op, lambda u=next_url, p=params: self._page_once(u, p))
            params = None  # the next link carries the query
            yield page

    def _page_once(self, url: str, params) -> tuple[list, str | None]:
        """One page of a listing, and the URL of the next one (None at the end)."""
        headers = hf_utils.build_hf_headers(token=self._token, library_name="speedtronic")
        headers["Accept-Encoding"] = "identity"  # Content-Length is then the body's true size
        session = hf_utils.get_session()
        r = session.get(url, params=params, headers=headers, timeout=self.timeout_s)
        hf_utils.hf_raise_for_status(r)
        return r.json(), r.links.get("next", {}).get("url")

    # -- the failure policy -------------------------------------------------------------------

    def _op(self, what: str, write: bool = False) -> _Op:
        return _Op(what, self.repo_id, write)

    def _run(self, op: _Op, fn: Callable[[], T]) -> T:
        """``fn()`` under the policy: transient failures retried, the rest raised at once."""
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.max_attempts),
            wait=self._wait,
            retry=tenacity.retry_if_exception_type(Transient),
            sleep=self._sleep,
            before_sleep=lambda state: self._log_retry(op, state),
            reraise=True,
        )
        try:
            return retrying(self._attempt, op, fn)
        except Transient as exc:
            message = self._msg(op, exc.status, exc.detail)
            message += f" (gave up after {self.max_attempts} attempts)"
            raise HubError(message, status=exc.status, maybe_landed=exc.ambiguous) from None

    def _attempt(self, op: _Op, fn: Callable[[], T]) -> T:
        _hook_session()
        token = _ACTIVE.set(self)
        try:
            return fn()
        except Exception as exc:
            raise self._classify(exc, op) from exc
        finally:
            _ACTIVE.reset(token)

    def _classify(self, exc: Exception, op: _Op) -> Exception:
        """The exception to raise for ``exc``: ``Transient`` (retry) or a ``HubError``."""
        if isinstance(exc, (Transient, HubError)):
            return exc
        if isinstance(exc, hf_errors.HfHubHTTPError) and exc.response is not None:
            return self._classify_http(exc, op)
        if isinstance(exc, _NETWORK):
            sent = not isinstance(exc, _NOT_SENT)
            detail = self._detail(f"{type(exc).__name__}: {exc}")
            return Transient(None, detail, ambiguous=op.write and sent and commit_request(exc))
        if isinstance(exc, RuntimeError) and "client has been closed" in str(exc):
            # huggingface_hub closes its shared session after a connection error in any
            # thread's request: this one picked up the closed session and was never sent
            return Transient(None, self._detail(f"{type(exc).__name__}: {exc}"))
        if isinstance(exc, hf_errors.LocalTokenNotFoundError):
            return HubError(self._msg(op, None, "no token found"), hint=_TOKEN_HINT, permanent=True)
        if isinstance(exc, (hf_errors.OfflineModeIsEnabled, hf_errors.HFValidationError)):
            return HubError(self._msg(op, None, self._detail(str(exc))), permanent=True)
        if isinstance(exc, (ValueError, KeyError, TypeError, httpx2.DecodingError)):
            # a garbled answer (a proxy's HTML page, a cut body): retried; a commit may have landed
            detail = self._detail(f"unreadable answer: {type(exc).__name__}: {exc}")
            return Transient(None, detail, ambiguous=op.write)
        return exc  # not a Hub failure: a bug to see, not to retry

    def _classify_http(self, exc: hf_errors.HfHubHTTPError, op: _Op) -> Exception:
        response = exc.response
        status, code = response.status_code, response.headers.get("X-Error-Code")
        detail = self._detail(exc.server_message or str(exc))
        if status in (408, 429) or status >= 500:
            ambiguous = op.write and status >= 500 and commit_request(exc)
            return Transient(status, detail, _server_wait(response), ambiguous)
        if status == 412:
            return CommitConflict(self._msg(op, status, detail, "commit conflict on"), status=412)
        if code == "RepoNotFound" or (status == 404 and code is None):  # user/org ops catch it
            hint = f"create it with: speedtronic hub init {self.repo_id}"
            message = self._msg(op, status, detail, "cannot find repo")
            return RepoNotFound(message, status=status, hint=hint, permanent=True)
        if code == "EntryNotFound":
            return _Missing(self._msg(op, status, detail), status=status)
        what, hint = {
            401: ("token rejected by the Hub for", _TOKEN_HINT),
            403: ("token cannot write to" if op.write else "token cannot read", _WRITE_HINT),
        }.get(status, (None, None))
        permanent = status in (400, 401, 403)  # a revision squashed away: read at a newer one
        return HubError(
            self._msg(op, status, detail, what), status=status, hint=hint, permanent=permanent
        )

    def _wait(self, state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception()
        if isinstance(exc, Transient) and exc.wait_s is not None:
            # What the server asked for, plus a little jitter so nodes do not return together.
            return min(exc.wait_s, self.max_backoff_s) + random.uniform(0.0, 1.0)
        return self._backoff(state)

    def _log_retry(self, op: _Op, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception()  # a Transient: only those are retried
        msg, n = self._msg(op, exc.status, exc.detail), state.attempt_number
        log.info("%s (attempt %d of %d); retrying", msg, n, self.max_attempts)

    def _msg(self, op: _Op, status: int | str | None, detail: str, what=None) -> str:
        prefix = f"{self.node_id}: " if self.node_id else ""
        code = status if status is not None else "no answer"
        return self._scrub(f"{prefix}{what or op.what} {op.subject} ({code}): {detail}")

    def _detail(self, text: str) -> str:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "no message")
        first = self._scrub(first)  # before cutting: a token across the cut would survive it
        return first if len(first) <= 200 else first[:197] + "..."

    def _scrub(self, text: str) -> str:
        for secret in {self._token, get_token()} - {None, ""}:
            text = text.replace(secret, "<token>")
        return text


def _hub_file(entry: RepoFile) -> HubFile:
    modified = entry.last_commit.date.timestamp() if entry.last_commit else None
    sha256 = entry.lfs.sha256 if entry.lfs else None
    return HubFile(entry.path, entry.size, entry.blob_id, sha256, modified)


def _server_wait(response: httpx2.Response) -> float | None:
    """Seconds the server asked for: an exhausted 429's RateLimit reset, or ``Retry-After``."""
    if response.status_code == 429:
        info = hf_utils.parse_ratelimit_headers(response.headers)
        if info is not None and info.remaining == 0:
            return float(info.reset_in_seconds)
    try:
        return max(0.0, float(response.headers.get("Retry-After", "")))
    except ValueError:
        return None  # absent, or an HTTP date (the Hub sends seconds)

"""Read-only files of a dataset (or model) repo: a revision pinned, a listing, resumable downloads.

The Hub client's reading side for corpora and tokenizers, on the same parts as ``HubClient``:
every call runs under ``policy.RequestPolicy`` (session hooks that count each request against the
``Budget`` and time it out, retries of 429 / 5xx / storage faults with backoff, one-line
token-free errors), listings are ``reads.Reads.page`` requests. ``RepoFiles``:

- ``resolve(revision)``: the commit sha a branch or tag names now, so a long tokenize reads one
  snapshot of the repo however it moves meanwhile;
- ``list_files(revision, prefix)``: every file under ``prefix``, recursively (paginated);
- ``download(file, revision, dest)``: a file's bytes streamed to ``dest`` (never held in
  memory); a ``dest`` already holding them (a cache) costs no request. The bytes go to
  ``dest.incomplete`` first; an attempt cut short (a dropped connection, a truncated body)
  leaves what arrived, and the next attempt asks for the rest with ``Range``. The finished file
  is checked against the listing (its LFS sha256, else its git blob id) before it is renamed
  to ``dest``; a mismatch is thrown away and fetched anew.

Dataset URLs are the Hub's: ``/api/datasets/<id>/...`` for the API, ``/datasets/<id>/resolve/
<sha>/<path>`` for the bytes (a 302 to the storage origin for LFS files, which the session
follows without the token).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from huggingface_hub import get_token, hf_hub_url
from huggingface_hub import utils as hf_utils
from huggingface_hub.hf_api import RepoFile

from speedtronic.hub.budget import Budget
from speedtronic.hub.classify import Missing
from speedtronic.hub.errors import HubError, Transient
from speedtronic.hub.files import HubFile, check_repo_path
from speedtronic.hub.reads import connect, hub_file
from speedtronic.hub.wording import Op, Wording

REPO_TYPES = ("dataset", "model")
_CHUNK = 1 << 20
READ_HINT = (
    "check the repo id on the Hub; a private or gated repo needs HF_TOKEN set to a token that "
    "can read it (for a gated one, accept its terms on its page first)"
)


class Cancelled(Exception):
    """A download stopped on request (no Hub failure: the policy passes it through)."""


class RepoFiles:
    """The files of one dataset or model repo, read-only. Thread-safe: downloads may overlap."""

    def __init__(
        self,
        repo_id: str,
        repo_type: str = "dataset",
        *,
        token: str | None = None,
        endpoint: str | None = None,
        budget: Budget | None = None,
        max_attempts: int = 8,
        max_backoff_s: float = 60.0,
        timeout_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if repo_type not in REPO_TYPES:
            raise ValueError(f"repo_type must be one of {REPO_TYPES}, not {repo_type!r}")
        self.repo_id, self.repo_type = repo_id, repo_type
        self.budget = budget if budget is not None else Budget()
        wording = Wording("", token, get_token)
        limits = {"max_attempts": max_attempts, "max_backoff_s": max_backoff_s, "sleep": sleep}
        self.policy, self.reads = connect(
            repo_id, wording, endpoint, token, self.budget, timeout_s=timeout_s, **limits
        )
        self.endpoint = self.reads.endpoint
        self.subject = f"{repo_type} {repo_id}"

    def __repr__(self) -> str:  # never the token
        return f"RepoFiles({self.repo_id!r}, {self.repo_type!r}, endpoint={self.endpoint!r})"

    def resolve(self, revision: str) -> str:
        """The commit sha ``revision`` (a branch, tag or sha) names now: one request."""
        api, kind = self.reads.api, self.repo_type
        info = api.dataset_info if kind == "dataset" else api.model_info

        def ask():
            return info(self.repo_id, revision=revision, expand=["sha"], timeout=self.timeout_s)

        return self._run(Op(f"cannot read revision {revision!r} of", self.subject), ask).sha

    @property
    def timeout_s(self) -> float:
        return self.policy.timeout_s

    def list_files(self, revision: str, prefix: str = "") -> list[HubFile]:
        """Files under ``prefix`` at ``revision``, recursively, sorted; [] without the prefix."""
        api = f"{self.endpoint}/api/{self.repo_type}s/{self.repo_id}"
        url = f"{api}/tree/{quote(revision, safe='')}"
        if prefix.strip("/"):
            url += "/" + quote(prefix.strip("/"), safe="")
        params: dict | None = {"recursive": "true", "expand": "false"}
        op = Op("cannot list files of", self.subject)
        found: list[HubFile] = []
        next_url: str | None = url
        try:
            while next_url:
                page, next_url = self._run(op, lambda u=next_url, p=params: self.reads.page(u, p))
                params = None  # the next link carries the query
                found += [hub_file(RepoFile(**e)) for e in page if e.get("type") == "file"]
        except Missing:
            return []
        return sorted(found, key=lambda f: f.path)

    def download(self, file: HubFile, revision: str, dest: Path, stop=None) -> str:
        """``file`` at ``revision`` into ``dest`` (resumed from ``dest.incomplete``); its sha256.
        ``stop`` (a ``threading.Event``) set meanwhile ends it with ``Cancelled``, what arrived
        kept in ``dest.incomplete`` for a later call."""
        check_repo_path(file.path)
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(dest.name + ".incomplete")
        url = hf_hub_url(
            self.repo_id, file.path, repo_type=self.repo_type, revision=revision,
            endpoint=self.endpoint,
        )  # fmt: skip
        op = Op(f"cannot download {file.path} at {revision[:12]} from", self.subject)
        if dest.is_file() and dest.stat().st_size == file.size:
            digest = _check_bytes(dest, file)
            if digest is not None:  # downloaded before (a cache, a resumed run): no request
                return digest

        def attempt() -> str:
            self._fetch_rest(url, part, file, stop)
            digest = _check_bytes(part, file)
            if digest is None:  # complete but wrong: never keep it, fetch it anew
                part.unlink(missing_ok=True)
                raise Transient(None, f"{file.path}: the downloaded bytes do not match the listing")
            return digest

        digest = self._run(op, attempt)
        os.replace(part, dest)
        return digest

    def _fetch_rest(self, url: str, part: Path, file: HubFile, stop=None) -> None:
        """One GET for what ``part`` lacks of ``file`` (all of it when the server ignores Range)."""
        have = part.stat().st_size if part.exists() else 0
        if have > file.size:
            have = 0
        if have == file.size:
            return
        headers = self.reads._headers()
        if have:
            headers["Range"] = f"bytes={have}-"
        session = hf_utils.get_session()
        with session.stream("GET", url, headers=headers, timeout=self.timeout_s) as r:
            hf_utils.hf_raise_for_status(r)
            if r.status_code != 206 or not _range_starts_at(r, have):
                have = 0  # a whole answer: start over rather than append it
            with open(part, "r+b" if have else "wb") as out:
                out.seek(have)
                out.truncate()
                for chunk in r.iter_bytes():  # as it arrives: a cut keeps what came
                    if stop is not None and stop.is_set():
                        raise Cancelled(f"download of {file.path} cancelled")
                    out.write(chunk)
                    if out.tell() > file.size:
                        break
        got = part.stat().st_size
        if got < file.size:  # cut short: keep what arrived, the next attempt asks for the rest
            raise Transient(None, f"truncated download of {file.path}: {got} of {file.size} bytes")
        if got > file.size:
            part.unlink(missing_ok=True)
            raise Transient(None, f"{file.path}: {got} bytes, the listing says {file.size}")

    def _run(self, op: Op, fn):
        try:
            return self.policy.run(op, fn)
        except Missing:
            raise
        except HubError as exc:
            if exc.status in (401, 403, 404) or exc.hint and "hub init" in exc.hint:
                # the client's hints are about run repos (create one, get write access)
                raise HubError(
                    str(exc), status=exc.status, permanent=exc.permanent, hint=READ_HINT
                ) from None
            raise


def _range_starts_at(response, offset: int) -> bool:
    return response.headers.get("Content-Range", "").startswith(f"bytes {offset}-")


def _check_bytes(path: Path, file: HubFile) -> str | None:
    """``path``'s sha256 if its bytes are ``file``'s (LFS sha256, else git blob id), else None."""
    sha256, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % file.size)
    with open(path, "rb") as f:
        while block := f.read(_CHUNK * 8):
            sha256.update(block)
            if file.sha256 is None:
                sha1.update(block)
    if file.sha256 is not None:
        return sha256.hexdigest() if sha256.hexdigest() == file.sha256 else None
    return sha256.hexdigest() if sha1.hexdigest() == file.oid else None

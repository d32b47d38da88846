"""Commits to main that land exactly once, their files uploaded on the path the library's hooks see.

``Commits.commit`` works in two steps, each under the request policy. First the upload: one
``preupload_lfs_files`` per file asks the Hub how to store it, and LFS files (every delta and
global: the Hub tracks ``*.safetensors`` with LFS) go through the Git LFS batch API, a PUT to
the storage's signed URL and verify. The files are handed over as ``io.BytesIO``: with
``bytes``, huggingface_hub would send them through hf_xet whenever it is installed (it is, by
default), whose own HTTP client bypasses the session hooks (no timeout, no counting, its own
silent retries); dense float deltas gain nothing from Xet's dedup (docs/hub.md). One file per
call keeps the library off its thread pool, where the hooks would not see the requests. A
failure there cannot have landed: it is retried from where it stopped (stored objects are not
sent again). Then the commit request. When its answer is lost after it was sent (5xx,
timeout, dropped connection), the next attempt first looks for the commit in main's recent
history by the random id in its description (``COMMIT_ID_KEY``) and returns its sha if it
landed; the repeat is sent with the head just seen as parent, so a late landing shows up as a
412 (looked for again), never as a second commit. A 412 on the caller's own ``parent`` is
``CommitConflict``. Every landed commit is counted in the budget.
"""

from __future__ import annotations

import io
import logging
import os
import secrets
import time
from typing import Any

from huggingface_hub import CommitOperationAdd, CommitOperationDelete
from huggingface_hub import utils as hf_utils

from speedtronic.hub import session
from speedtronic.hub.errors import CommitConflict, HubError, Transient
from speedtronic.hub.policy import RequestPolicy
from speedtronic.hub.reads import Reads
from speedtronic.hub.wording import Op

# In each commit's description: a lost commit is looked for by it (its files may be gone since)
COMMIT_ID_KEY = "speedtronic-commit-id"
_LOOKUP_SKEW_S = 600.0  # how much older than the first attempt the history is searched
_LOOKUP_PAGES = 10  # ... and at most this many pages of it (the commits endpoint pages by 50)
# What huggingface_hub logs, at WARNING, for every upload handed over as a buffer: the LFS
# path is our choice, not a degradation to tell the user about at each delta
_XET_FALLBACK_NOTICE = "Uploading files as a binary IO buffer is not supported by Xet Storage"


class _QuietXetFallback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_XET_FALLBACK_NOTICE)


_QUIET = _QuietXetFallback()
logging.getLogger("huggingface_hub._commit_api").addFilter(_QUIET)


class Commits:
    """Commits to ``reads``' repo under ``policy``."""

    def __init__(self, reads: Reads, policy: RequestPolicy):
        self.reads, self.policy = reads, policy
        self.repo_id = reads.repo_id

    def commit(self, adds: dict[str, Any], deletes: list[str], message: str, parent=None) -> str:
        """One commit of ``adds`` and ``deletes`` to main; returns the new head sha (see the
        module's docstring for the upload, lost answers and conflicts). An add's content is
        ``bytes``, or the ``Path`` of a local file (read from disk as it uploads, for files too
        large to hold in memory, e.g. a model's weights)."""
        buffers: list[io.BufferedIOBase] = []
        try:
            for data in adds.values():
                buffers.append(_buffer(data))
            ops = [CommitOperationAdd(p, b) for p, b in zip(adds, buffers, strict=True)]
            return self._commit(ops, deletes, message, parent)
        finally:
            for buffer in buffers:
                buffer.close()

    def _commit(self, ops: list, deletes: list[str], message: str, parent) -> str:
        if ops:
            upload = Op("cannot upload to", self.repo_id, write=True)
            self.policy.run(upload, lambda: self._upload(ops))
        ops += [CommitOperationDelete(path_in_repo=p) for p in deletes]
        op = Op("cannot commit to", self.repo_id, write=True)
        pin = {"parent": parent, "lost": False, "check": False}  # lost: ever; check: pending
        commit_id, started = secrets.token_hex(12), time.time()
        description = f"{COMMIT_ID_KEY}: {commit_id}"

        def attempt() -> str:
            if pin["check"]:
                landed, head = self.landed(commit_id, started)
                if landed:
                    return self._counted(landed)
                if parent is not None and head != parent:
                    moved = self.policy.wording.message(
                        op, 412, f"main is at {head[:12]} now", "commit conflict on"
                    )
                    raise CommitConflict(moved, status=412)
                pin["parent"], pin["check"] = head, False
            try:
                sha = self._send(ops, message, description, pin["parent"])
            except Exception as exc:
                err = self.policy.classifier.classify(exc, op, session.current())
                if isinstance(err, CommitConflict) and pin["lost"]:  # ours, landing late?
                    err = Transient(412, "the head moved", ambiguous=True)
                if isinstance(err, Transient) and err.ambiguous:
                    pin["lost"] = pin["check"] = True
                if err is exc:
                    raise
                raise err from exc
            return self._counted(sha)

        try:
            return self.policy.run(op, attempt)
        except HubError as exc:
            if not pin["lost"]:
                raise
            read = Op("cannot read", self.repo_id)
            landed = self.policy.run(read, lambda: self.landed(commit_id, started))[0]
            if landed is None:  # still unknown: the caller must send these same bytes again
                exc.maybe_landed = True
                raise
            return self._counted(landed)

    def _counted(self, sha: str) -> str:
        self.policy.budget.count_commit()
        return sha

    def _upload(self, adds: list[CommitOperationAdd]) -> None:
        """Ask how each file is stored and upload the LFS ones; files done in an earlier
        attempt (their mode known, their object stored) cost no request again."""
        for add in adds:
            _rewind(add)
            self.reads.api.preupload_lfs_files(self.repo_id, additions=[add])

    def _send(self, ops: list, message: str, description: str, parent) -> str:
        """The commit request: the library sees every file uploaded and sends only the commit
        (the operations are marked used only once it succeeded)."""
        for add in ops:
            _rewind(add)
        return self.reads.api.create_commit(
            self.repo_id,
            ops,
            commit_message=message,
            commit_description=description,
            parent_commit=parent,
        ).oid

    def landed(self, commit_id: str, since: float) -> tuple[str | None, str]:
        """(sha of the commit carrying ``commit_id`` or None, main's head), from main's history
        back to ``since`` less a margin for clock skew; usually one request."""
        url: str | None = f"{self.reads.endpoint}/api/models/{self.repo_id}/commits/main"
        head, pages = None, 0
        while url and pages < _LOOKUP_PAGES:
            (page, url), pages = self.reads.page(url, None), pages + 1
            for item in page:
                head = head or item["id"]
                if commit_id in f"{item.get('title', '')}\n{item.get('message') or ''}":
                    return item["id"], head
                if hf_utils.parse_datetime(item["date"]).timestamp() < since - _LOOKUP_SKEW_S:
                    return None, head
        return None, head or self.reads.head()


def _buffer(data: Any) -> io.BufferedIOBase:
    """What the library reads a file from: always a buffer (bytes or a path would go to hf_xet,
    see the module docstring), ``bytes`` in memory or a local file opened for reading."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return io.BytesIO(data)
    if isinstance(data, (str, os.PathLike)):
        return open(data, "rb")  # noqa: SIM115 -- closed by commit() once the commit is done
    raise TypeError(f"a commit's file is bytes or a path, not {type(data).__name__}")


def _rewind(op) -> None:
    """Put a file's buffer back at its start. The library reads it from where it is, and does
    not seek back when a PUT fails: a retry would send the rest (nothing), which the storage
    refuses as short of the size it signed for."""
    if isinstance(getattr(op, "path_or_fileobj", None), io.BufferedIOBase):
        op.path_or_fileobj.seek(0)

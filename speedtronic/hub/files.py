"""What the Hub says about files and commits, as plain records, and how to match bytes to them.

``HubFile`` and ``HubCommit`` are what ``hub.HubClient`` returns; ``git_blob_oid`` is the id
the Hub gives a non-LFS file, so a listing can say whether a file holds some bytes;
``check_repo_path`` refuses a path that would leave the repo. Stdlib only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from speedtronic.errors import TransportError


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    oid: str  # git blob id: changes when the bytes change
    sha256: str | None  # LFS sha256 when the file is in LFS, else None
    modified: float | None  # unix time of the last commit touching it (with_times), else None


@dataclass(frozen=True)
class HubCommit:
    sha: str
    time: float  # unix seconds
    title: str


def git_blob_oid(data: bytes) -> str:
    """The id git (and the Hub, for non-LFS files) gives ``data``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def check_repo_path(path: str) -> str:
    """``path`` if it is a plain relative repo path (no '..', '.', empty or absolute parts)."""
    parts = path.split("/") if isinstance(path, str) else [""]
    if any(p in ("", ".", "..") or "\\" in p or "\x00" in p for p in parts):
        raise TransportError(f"refusing repo path {path!r}")
    return path

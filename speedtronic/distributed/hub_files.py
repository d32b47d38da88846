"""What the Hub says about files and commits, as plain records, and how to match bytes to them.

``HubFile`` and ``HubCommit`` are what ``hub.HubClient`` returns; ``same_bytes`` decides whether
a file in the repo holds exactly some bytes (by git blob id, or LFS sha256), which is how a
commit whose answer was lost is recognised as landed. Stdlib only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


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


def same_bytes(file: HubFile, data: bytes) -> bool:
    """Whether ``file`` in the repo holds exactly ``data``."""
    if file.size != len(data):
        return False
    if file.sha256:
        return file.sha256 == hashlib.sha256(data).hexdigest()
    return file.oid == git_blob_oid(data)

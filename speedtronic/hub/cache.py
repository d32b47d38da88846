"""The Hub client's download cache: ``global/`` files by commit sha, the newest revision only.

Deltas are read once and so never cached, and branch names are no pins, so only ``global/``
files at full commit shas are kept, under ``<base>/hub/<owner>--<name>/<node_id>/<sha>/``
(``base`` defaults to the platformdirs user cache dir). Storing a revision drops the older
ones: a superseded global is never read again. Best effort throughout: a cache that cannot be
read or written is skipped, never fatal. Stdlib and platformdirs only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
from pathlib import Path

from platformdirs import user_cache_dir

_SHA_RE = re.compile(r"[0-9a-f]{40}")
log = logging.getLogger("speedtronic.hub")


class DownloadCache:
    """Files of one repo, for one node; thread- and process-safe (atomic renames)."""

    def __init__(self, repo_id: str, node_id: str, base: str | Path | None = None):
        base = base if base is not None else user_cache_dir("speedtronic")
        self.root = Path(base, "hub", repo_id.replace("/", "--"), node_id or "default")

    def path(self, repo_path: str, revision: str) -> Path | None:
        """Where ``repo_path`` at ``revision`` lives, None when it is not cached at all."""
        parts = repo_path.split("/")
        if parts[0] != "global" or not _SHA_RE.fullmatch(revision) or {"", ".", ".."} & {*parts}:
            return None
        return self.root.joinpath(revision, *parts)

    def read(self, repo_path: str, revision: str, max_bytes: int) -> bytes | None:
        cached = self.path(repo_path, revision)
        with contextlib.suppress(OSError):
            if cached is not None and cached.stat().st_size <= max_bytes:
                return cached.read_bytes()
        return None

    def store(self, repo_path: str, revision: str, data: bytes) -> None:
        """Keep this copy and drop every other revision (superseded globals)."""
        target = self.path(repo_path, revision)
        if target is None:
            return
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, target)
            for old in self.root.iterdir():
                if old.name != revision and _SHA_RE.fullmatch(old.name):
                    shutil.rmtree(old, ignore_errors=True)
        except OSError as exc:
            log.debug("hub cache: %s", exc)

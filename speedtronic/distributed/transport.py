"""How nodes reach the shared repo: the ``Transport`` interface and the shared-directory one.

A transport moves bytes between a node and the run's repo (layout in ``protocol``): uploads of
deltas, a listing of ``nodes/`` only, reads of listed files, a cheap read of the published
outer step, and the master's publish of new global weights. ``LocalTransport`` implements it
over a directory (NFS, a synced folder, or several processes on one machine); the other
implementations live in their own packages (``hub/``), and ``repos.open_transport``, the one
composition root, picks one from the repo spec: this module knows none of them.
Everything read from the repo is untrusted: links and non-regular files are skipped, reads are
capped, and what comes back is data for ``codec`` to validate.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from speedtronic.checkpoint.files import TMP_PREFIX
from speedtronic.distributed import repo_files
from speedtronic.distributed.protocol import (
    GLOBAL_WEIGHTS,
    NODES_DIR,
    STEP_COUNT,
    check_deletable,
    delta_path_problem,
    parse_step_count,
)
from speedtronic.errors import ConfigError, DamagedRepoFile, TransportError

MAX_STEP_COUNT_BYTES = 64 << 10  # step_count.json is a few hundred bytes
# open() failures that mean the repo holds the wrong kind of entry, not a passing fault
_DAMAGE_ERRNOS = (errno.ELOOP, errno.ENOTDIR, errno.EISDIR)
_NO_ACCESS_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)


@dataclass(frozen=True)
class DeltaRef:
    """A listed entry under ``nodes/``: its repo path, size, and a version that changes when its
    bytes do. ``problem`` says why it is not a delta (its name, a link, a folder...), or None."""

    path: str
    size: int
    version: str
    problem: str | None = None
    modified: float | None = None  # seconds since the epoch, where the listing gives it


class Transport(Protocol):
    """What the coordinator needs from a shared repo. Methods may raise TransportError.

    ``upload`` and ``publish`` raise only when nothing landed, so callers may retry or fold.
    """

    def upload(self, path: str, data: bytes) -> None: ...

    def list_deltas(self) -> list[DeltaRef]:
        """Every entry under ``nodes/``: deltas, and the others with their ``problem`` (I4:
        whatever is not ours is reported, so the master can log it once by name)."""

    def read(self, path: str, max_bytes: int) -> bytes | None: ...

    def read_step_count(self) -> dict[str, Any] | None: ...

    def publish(self, weights: bytes, step_count: dict[str, Any], consumed: list[str]) -> None: ...

    def describe(self) -> str: ...

    def prepare(self, settings: Any, logger: Any) -> None:
        """Before training: create what the role needs, refuse early what cannot work."""

    def cadence_warnings(self, settings: Any, step_time_s: float | None) -> list[str]:
        """Where the configured cadence would exceed the service's limits (none here)."""

    def stats(self) -> dict[str, int]:
        """Request counters worth logging (the Hub's budgets); numbers only."""


class LocalTransport:
    """A shared directory. Every write is a temporary file, fsynced, then renamed into place.

    ``publish`` writes the weights before ``step_count.json``, and both name the outer step
    (the weights in their header), so a reader that sees a new step count but older weights
    (a publish in flight, or a master killed between the two renames) waits for the next poll
    rather than installing a mismatched pair.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.create_root = True  # a worker's (``prepare``): never; the master's: at the start

    def describe(self) -> str:
        return str(self.root)

    def prepare(self, settings: Any, logger: Any) -> None:
        """The master creates the shared directory; a worker never does (a mistyped or unmounted
        path would become a directory of its own, silently, that no master reads): a missing
        one is a configuration error (exit 2)."""
        if getattr(settings, "role", "worker") == "master":
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise TransportError(f"cannot create {self.root}: {exc.strerror}") from exc
            return
        self.create_root = False
        if not self.root.is_dir():
            key = (
                "distributed.repo_id" if getattr(settings, "repo_id", None) else "distributed.path"
            )
            raise ConfigError(
                f"{key}: the shared directory {self.root} does not exist (a worker never creates "
                "it: is the path right, and mounted on this machine?)",
                hint="start the master first (it creates the directory), or create it yourself",
            )

    def cadence_warnings(self, settings: Any, step_time_s: float | None) -> list[str]:
        return []  # a directory has no request budget

    def stats(self) -> dict[str, int]:
        return {}

    def upload(self, path: str, data: bytes) -> None:
        self._write(path, data)

    def list_deltas(self) -> list[DeltaRef]:
        """Every entry under ``nodes/``, each folder opened without following a link."""
        try:
            with repo_files.folder(self.root, (NODES_DIR,), create=False) as fd:
                entries = sorted(os.scandir(fd), key=lambda e: e.name)
                refs = []
                for entry in entries:
                    path = f"{NODES_DIR}/{entry.name}"
                    if entry.is_dir(follow_symlinks=False):
                        refs.extend(self._list_node(entry.name, path))
                    elif not entry.name.startswith(TMP_PREFIX):
                        refs.append(_stranger(entry, path, "not inside a node's folder"))
                return refs
        except FileNotFoundError:
            return []
        except repo_files.NotAFolder:  # nodes/ itself is a link or a file: nothing to read
            return [DeltaRef(NODES_DIR, 0, "not-a-delta: not a folder", "a link or not a folder")]
        except OSError as exc:
            raise TransportError(f"cannot list {self.root / NODES_DIR}: {exc.strerror}") from exc

    def _list_node(self, name: str, folder: str) -> list[DeltaRef]:
        try:
            with repo_files.folder(self.root, (NODES_DIR, name), create=False) as fd:
                # a write in flight (ours or a worker's) becomes a file or goes: not listed
                entries = [e for e in os.scandir(fd) if not e.name.startswith(TMP_PREFIX)]
                refs = [self._ref(entry, f"{folder}/{entry.name}") for entry in entries]
        except OSError:
            return []  # vanished, unreadable or replaced by a link: the next poll looks again
        return sorted(refs, key=lambda r: r.path)

    @staticmethod
    def _ref(entry: os.DirEntry, path: str) -> DeltaRef:
        problem = delta_path_problem(path) or _kind_problem(entry)
        if problem is not None:
            return _stranger(entry, path, problem)
        info = entry.stat(follow_symlinks=False)
        version = f"{info.st_mtime_ns}-{info.st_size}"
        return DeltaRef(path, info.st_size, version, modified=info.st_mtime)

    def file_sizes(self, folder: str) -> dict[str, int]:
        """The regular files in ``folder`` by repo path, with their sizes; links, folders and
        writes in flight are left out, a missing folder is empty. What a status view reads of
        ``global/``; nodes never need it."""
        try:
            with repo_files.folder(self.root, tuple(self._parts(folder)), create=False) as fd:
                return {
                    f"{folder}/{e.name}": e.stat(follow_symlinks=False).st_size
                    for e in os.scandir(fd)
                    if e.is_file(follow_symlinks=False) and not e.name.startswith(TMP_PREFIX)
                }
        except (FileNotFoundError, repo_files.NotAFolder):
            return {}
        except OSError as exc:
            raise TransportError(f"cannot list {self.root / folder}: {exc.strerror}") from exc

    def read(self, path: str, max_bytes: int) -> bytes | None:
        """The file's bytes, None if it is gone; refuses links (at any depth), non-regular and
        oversize files."""
        *folders, name = self._parts(path)
        try:
            with repo_files.folder(self.root, tuple(folders), create=False) as fd:
                return self._read_in(fd, name, path, max_bytes)
        except FileNotFoundError:
            return None
        except repo_files.NotAFolder as exc:  # a link, or a file where a folder should be
            raise DamagedRepoFile(f"cannot read {path}: {exc.strerror}") from exc
        except OSError as exc:
            if exc.errno in _DAMAGE_ERRNOS:
                raise DamagedRepoFile(f"cannot read {path}: {exc.strerror}") from exc
            raise TransportError(f"cannot read {path}: {exc.strerror}") from exc

    @staticmethod
    def _read_in(folder_fd: int, name: str, path: str, max_bytes: int) -> bytes:
        fd = os.open(name, os.O_RDONLY | repo_files.NOFOLLOW | os.O_NONBLOCK, dir_fd=folder_fd)
        try:  # fstat before fdopen: opening a folder's fd as a file raises a nameless error
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise DamagedRepoFile(f"{path} is not a regular file")
            if info.st_size > max_bytes:
                raise DamagedRepoFile(f"{path} is {info.st_size} bytes, over the {max_bytes} cap")
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read(max_bytes + 1)
        finally:
            os.close(fd)
        if len(data) > max_bytes:  # grew since the fstat
            raise DamagedRepoFile(f"{path} is over the {max_bytes} byte cap")
        return data

    def read_step_count(self) -> dict[str, Any] | None:
        data = self.read(STEP_COUNT, MAX_STEP_COUNT_BYTES)
        return None if data is None else parse_step_count(data)

    def publish(self, weights: bytes, step_count: dict[str, Any], consumed: list[str]) -> None:
        doomed = [check_deletable(path) for path in consumed]  # refused before anything lands
        self._write(GLOBAL_WEIGHTS, weights)
        self._write(STEP_COUNT, json.dumps(step_count, indent=2).encode() + b"\n")
        for path in doomed:
            self._delete(path)

    def _parts(self, path: str) -> list[str]:
        """The parts of a repo path that stays inside the root (no '..', no absolute)."""
        parts = Path(path).parts
        if not parts or Path(path).is_absolute() or any(p in ("..", ".", "") for p in parts):
            raise TransportError(f"refusing repo path {path!r}")
        return list(parts)

    def _write(self, path: str, data: bytes) -> None:
        """Write ``path`` atomically; a link, file or FIFO where a folder belongs (a ``global``
        link, a folder named ``step_count.json``) is cleared first: writes never follow a link
        out of the repo, and a damaged ``global/`` is restored rather than failing forever."""
        *folders, name = self._parts(path)
        if not self.create_root and not self.root.is_dir():  # unmounted, or deleted: not ours
            error = TransportError(f"cannot write {path}: the shared directory {self.root} is gone")
            error.permanent = True
            raise error
        try:
            with repo_files.folder(self.root, tuple(folders), create=True) as fd:
                repo_files.replace_in(fd, name, data)
                # The file has landed: raising now would make the caller send it again.
                with contextlib.suppress(OSError):
                    repo_files.sync(fd)
        except OSError as exc:
            error = TransportError(f"cannot write {path} in {self.root}: {exc.strerror}")
            error.permanent = exc.errno in _NO_ACCESS_ERRNOS  # retrying cannot help
            raise error from exc

    def _delete(self, path: str) -> None:
        """Delete a consumed delta by the rules of writes: no link followed at any depth, so a
        delta's folder replaced by a link to another directory deletes nothing there."""
        *folders, name = self._parts(path)
        try:
            with repo_files.folder(self.root, tuple(folders), create=False) as fd:
                repo_files.delete_in(fd, name)
        except (FileNotFoundError, repo_files.NotAFolder):
            return  # gone, or no folder of the repo any more: nothing of ours to delete there
        except OSError as exc:
            raise TransportError(f"cannot delete {path} in {self.root}: {exc.strerror}") from exc


def _kind_problem(entry: os.DirEntry) -> str | None:
    """Why a listed entry is no file to read: links are never followed (I4)."""
    if entry.is_symlink():
        return "a symbolic link"
    if entry.is_dir(follow_symlinks=False):
        return "a folder"
    if not entry.is_file(follow_symlinks=False):
        return "not a regular file"
    return None


def _stranger(entry: os.DirEntry, path: str, problem: str) -> DeltaRef:
    """A listed entry that is not a delta, with the reason; its version is its reason."""
    problem = _kind_problem(entry) or problem
    return DeltaRef(path, 0, f"not-a-delta: {problem}", problem)

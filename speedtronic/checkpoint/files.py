"""Durable file primitives for checkpoints: fsync, atomic renames and pointer replacement.

Stdlib only. ``install_dir`` renames a finished temporary dir into place without a moment in
which no copy of that step exists; ``write_latest`` replaces ``latest.json`` atomically; the
fsync helpers make both durable. Shared by saving and by ``benchmarks/engine/checkpoint.py``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from speedtronic.checkpoint.layout import LATEST_FILE, TMP_PREFIX


def write_json(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, indent=2, default=str) + "\n")
        flush_and_sync(f)


def write_small_files(folder: Path, files: dict[str, bytes]) -> dict[str, dict]:
    """Write each small file into ``folder``, fsynced; returns their meta.json records."""
    records = {}
    for name, data in files.items():
        with open(folder / name, "wb") as f:
            f.write(data)
            flush_and_sync(f)
        records[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return records


def flush_and_sync(f) -> None:
    f.flush()
    os.fsync(f.fileno())


def fsync_file(path: Path) -> None:
    """fsync by path: any descriptor of the inode flushes its dirty pages."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make renames and new entries in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some filesystems cannot fsync a directory; their renames are as durable as they get.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def install_dir(tmp: Path, final: Path) -> Path:
    """Rename the finished tmp dir to its final name, replacing a stale dir of the same step.

    A stale dir (from a crash or an earlier run) is moved aside rather than deleted first,
    so that some copy of this step exists at every moment; it is deleted once ours is in place.
    """
    aside = None
    if final.exists():
        aside = final.with_name(f"{TMP_PREFIX}{final.name}-{os.getpid()}-old")
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(final, aside)
    try:
        os.rename(tmp, final)
    except OSError:
        if aside is not None:
            os.rename(aside, final)
        raise
    fsync_dir(final.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    return final


def replace_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to a ``.tmp-*`` sibling, fsync it, rename it over ``path``.

    Readers see the old file or the whole new one, never a torn write; the tmp file is removed
    if anything fails. The directory is not fsynced: callers decide when the rename must be
    durable (``fsync_dir``).
    """
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            flush_and_sync(f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_latest(root: Path, step: int, name: str) -> None:
    pointer = json.dumps({"step": int(step), "path": name}, indent=2) + "\n"
    replace_atomically(root / LATEST_FILE, pointer.encode())
    fsync_dir(root)

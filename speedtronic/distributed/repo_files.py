"""Files in a shared-directory repo, reached without following a link at any depth. Stdlib only.

Anyone with write access to the repo can replace a folder on a path by a symbolic link to
another directory, between two polls or at any moment. So no path is ever resolved by name
from the root: every folder is opened relative to the one before with ``O_NOFOLLOW`` (a link
fails with ELOOP, a file where a folder belongs with ENOTDIR), and the file itself is read,
written (a temporary sibling, fsynced, renamed into place) or deleted relative to the last
folder's descriptor. What a writer swaps in after a folder was opened is not on the path any
more, so there is no window between a check and its use. The root itself is the user's
configuration and may be a link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import uuid
from collections.abc import Iterator

from speedtronic.checkpoint.files import TMP_PREFIX

_FOLDER = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
_FOLDER |= getattr(os, "O_NONBLOCK", 0)  # a FIFO where a folder belongs never blocks the open
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# open() failures that mean the repo holds the wrong kind of entry, not a passing fault
NOT_A_FOLDER = (errno.ELOOP, errno.ENOTDIR)


class NotAFolder(OSError):
    """A step of the path is a link, a file or a FIFO where the layout has a folder."""


@contextlib.contextmanager
def folder(root: str | os.PathLike, parts: tuple[str, ...], create: bool) -> Iterator[int]:
    """A descriptor of ``root/parts...``, each step opened without following a link.

    ``create``: missing folders are made, and whatever stands where a folder belongs (a
    file, a link, a FIFO) is removed first (it is in the repo: removing it never touches
    anything outside). Otherwise a missing step raises FileNotFoundError and a step that is
    not a folder ``NotAFolder``.
    """
    if create:
        os.makedirs(root, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        for part in parts:
            step = _step(fd, part, create)
            os.close(fd)
            fd = step
        yield fd
    finally:
        os.close(fd)


def _step(fd: int, part: str, create: bool) -> int:
    try:
        return os.open(part, _FOLDER, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as exc:
        if exc.errno not in NOT_A_FOLDER:
            raise
        if not create:
            raise NotAFolder(exc.errno, f"{part} is a link or not a folder") from None
        os.unlink(part, dir_fd=fd)  # unlink removes a link itself, never what it points to
    with contextlib.suppress(FileExistsError):  # another node made it meanwhile
        os.mkdir(part, dir_fd=fd)
    return os.open(part, _FOLDER, dir_fd=fd)


def replace_in(fd: int, name: str, data: bytes) -> None:
    """Write ``data`` as ``name`` in the folder ``fd``: a temporary sibling, fsynced, renamed
    over whatever is there (a link is replaced, not followed; a folder is removed first)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
            shutil.rmtree(name, dir_fd=fd)  # fd-based: it never follows a link inside
    tmp = f"{TMP_PREFIX}{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644, dir_fd=fd)
    try:
        with os.fdopen(out, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=fd)
        raise


def sync(fd: int) -> None:
    """Make the renames in the folder ``fd`` durable (where the filesystem can)."""
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise


def delete_in(fd: int, name: str) -> None:
    """Remove the entry ``name`` of the folder ``fd`` if it is not a folder (a file or a link:
    the entry itself, never what a link points to); absent is fine."""
    try:
        if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
            return  # a folder now stands there: not the file that was settled
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass

"""A file hashed while it is written: the writer's sink and the thread that reads behind it.

torch.save hands its writer memoryviews valid only during ``write()``: hashing them inline would
add the whole hash time to a save, and handing them to a thread would need a copy. ``Sink`` is
the unbuffered file-like target torch.save writes to; it tells a ``TailHasher`` how far the file
has landed, and the hasher, on a helper thread (or, where none can start, on the caller's once
the file is whole), reads the file back behind the writer (from the page cache) in bounded
memory. ``Sink.error`` keeps the first OS error a write raised (a full disk): torch's zip writer
swallows it and fails later on a check of its own. Stdlib only.
"""

from __future__ import annotations

import errno
import hashlib
import threading
from pathlib import Path

from speedtronic.checkpoint.helpers import Helpers
from speedtronic.checkpoint.layout import READ_CHUNK_BYTES


class Sink:
    """Unbuffered file-like target for torch.save that tells the hasher what has landed."""

    def __init__(self, f, hasher: TailHasher):
        self._f, self._hasher, self.size = f, hasher, 0
        self.error: OSError | None = None  # the first write that failed (a full disk)

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        total = len(view)
        while view:  # raw writes may be partial
            try:
                view = view[self._f.write(view) :]
            except OSError as exc:
                self.error = self.error or exc
                raise
        self.size += total
        self._hasher.advance(self.size)
        return total

    def flush(self) -> None:
        pass  # unbuffered: every write() is already in the kernel


class TailHasher:
    """sha256 of a file that another thread is still appending to, read behind the writer."""

    def __init__(self, path: Path, pool: Helpers):
        self._cond = threading.Condition()
        self._written, self._closed = 0, False
        self.future = pool.submit(self._run, path)

    def advance(self, written: int) -> None:
        with self._cond:
            self._written = written
            self._cond.notify()

    def close(self) -> None:
        """No more data: the future completes once everything written so far is hashed."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self, path: Path) -> str:
        sha, done = hashlib.sha256(), 0
        buffer = memoryview(bytearray(READ_CHUNK_BYTES))
        with open(path, "rb", buffering=0) as f:
            while True:
                with self._cond:
                    while self._written == done and not self._closed:
                        self._cond.wait()
                    target, closed = self._written, self._closed
                while done < target:
                    n = f.readinto(buffer[: min(len(buffer), target - done)])
                    if not n:
                        raise OSError(errno.EIO, f"{path} shrank while being hashed")
                    sha.update(buffer[:n])
                    done += n
                if closed and done == target:
                    return sha.hexdigest()

"""Helper threads for a checkpoint's hashing and fsyncs, and the calling thread when none starts.

A save or a load hashes its files on helper threads (sha256 and file I/O drop the GIL, so they
overlap the writing or the loading). On a loaded machine, or in a process at its thread limit,
starting a thread may fail (``RuntimeError: can't start new thread``: a test run of the suite
failed so once in the checkpoint writer's pool). A save must not depend on a spare thread:
``Helpers.submit`` then returns a future that does the work on the thread that asks for its
result, later and slower, but the same bytes and the same hashes. At most ``limit`` helpers
run at once; past that the work waits for one to finish, as a pool's would. Stdlib only
(``ckpt inspect --verify`` hashes without importing torch).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class Inline(Future):
    """A future whose work runs on the first thread that asks for its result."""

    def __init__(self, work: Callable[[], Any]):
        super().__init__()
        self._work: Callable[[], Any] | None = work
        self._once = threading.Lock()

    def result(self, timeout: float | None = None) -> Any:
        self._run()
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._run()
        return super().exception(timeout)

    def _run(self) -> None:
        with self._once:
            work, self._work = self._work, None
        if work is None:
            return
        try:
            self.set_result(work())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever asks, as a pool does
            self.set_exception(exc)


class Helpers:
    """``submit(fn, *args)`` on a helper thread when one starts, else on the asking thread; a
    context manager that waits for its threads on exit (as ``ThreadPoolExecutor`` does)."""

    def __init__(self, limit: int, name: str = "ckpt-io"):
        self.slots = threading.BoundedSemaphore(max(1, limit))
        self.name = name
        self.threads: list[threading.Thread] = []
        self.inline = 0  # work that could get no thread (for tests and reports)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        self.slots.acquire()  # at most ``limit`` at once: the rest wait for a free one

        def run() -> None:
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever asks
                future.set_exception(exc)
            finally:
                self.slots.release()

        thread = threading.Thread(target=run, name=f"{self.name}-{len(self.threads)}", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # "can't start new thread": the asking thread does the work
            self.slots.release()
            self.inline += 1
            return Inline(lambda: fn(*args))
        self.threads.append(thread)
        return future

    def __enter__(self) -> Helpers:
        return self

    def __exit__(self, *exc: Any) -> None:
        for thread in self.threads:
            thread.join()

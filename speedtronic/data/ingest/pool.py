"""Units through worker processes with the order kept and a bounded number in flight.

``ordered(items, pool, window)`` submits work items ahead (at most ``window`` in flight, so
memory stays bounded whatever the corpus) and yields ``(item, result)`` in the order the items
came, however the workers finish. Items that are not ``work.Task`` (a file's end) pass through
in their place without a worker. ``Inline`` runs the same code in this process for one worker:
no process to start, nothing to pickle, the plain loop's cost. Worker processes are spawned, not
forked: the main process runs download threads, and a fork would copy their locks mid-use.

A worker that dies is ``BrokenProcessPool`` here even where the executor cannot tell: killed
while it wrote a result (the OOM killer's way), it leaves half a message in the result pipe,
and CPython's executor then waits for the rest for ever (seen in the slow tier's kill test,
1 run in 3). So a wait for a result looks at the workers every ``WATCH_S``; on a death it kills
the rest and closes the executor's own end of that pipe, so its reader sees the end and stops,
and the interpreter's exit, which joins it, does not hang.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as NotYet  # builtin TimeoutError from 3.11
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from speedtronic.data.ingest import work

WATCH_S = 1.0  # how often a wait for a result looks at the worker processes


class _Done:
    def __init__(self, fn, arg):
        self._fn, self._arg = fn, arg

    def result(self, timeout: float | None = None) -> Any:  # computed here: no wait
        return self._fn(self._arg)


class Inline:
    """One worker: the units are read and encoded here, when their result is asked for."""

    def __init__(self, setup: work.Setup):
        work.init(setup)

    def submit(self, fn, arg) -> _Done:
        return _Done(fn, arg)

    def shutdown(self, **_: Any) -> None:
        pass


def make_pool(setup: work.Setup, workers: int) -> Any:
    if workers <= 1:
        return Inline(setup)
    context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(
        workers, mp_context=context, initializer=work.init, initargs=(setup, os.getpid())
    )


def ordered(items: Iterable[Any], pool: Any, window: int) -> Iterator[tuple[Any, Any]]:
    """``(item, result)`` in input order; ``result`` is None for items that are no Task."""
    pending: deque = deque()
    source = iter(items)
    exhausted = False
    while True:
        while not exhausted and len(pending) < window:
            item = next(source, None)
            if item is None:
                exhausted = True
                break
            is_task = isinstance(item, work.Task)
            pending.append((item, pool.submit(work.work, item) if is_task else None))
        if not pending:
            return
        item, future = pending.popleft()
        yield item, (result(future, pool) if future is not None else None)


def result(future: Any, pool: Any) -> Any:
    """``future``'s result; ``BrokenProcessPool`` once a worker of ``pool`` has died."""
    while True:
        try:
            return future.result(timeout=WATCH_S)
        except NotYet:
            processes = list((getattr(pool, "_processes", None) or {}).values())
            if any(p.exitcode is not None for p in processes):
                _abandon(pool, processes)
                raise BrokenProcessPool("a worker process died") from None


def _abandon(pool: Any, processes: list) -> None:
    """Kill the workers still running and close this process's end of the result pipe: its
    other ends went with the workers, so the executor's reader, waiting for the rest of a
    message a dead worker cut, reads the pipe's end instead and stops."""
    for process in processes:
        if process.exitcode is None:
            process.kill()
            process.join(timeout=10)
    writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)
    if writer is not None:
        writer.close()

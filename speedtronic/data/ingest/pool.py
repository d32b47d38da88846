"""Units through worker processes with the order kept and a bounded number in flight.

``ordered(items, pool, window)`` submits work items ahead (at most ``window`` in flight, so
memory stays bounded whatever the corpus) and yields ``(item, result)`` in the order the items
came, however the workers finish. Items that are not ``work.Task`` (a file's end) pass through
in their place without a worker. ``Inline`` runs the same code in this process for one worker:
no process to start, nothing to pickle, the plain loop's cost. Worker processes are spawned, not
forked: the main process runs download threads, and a fork would copy their locks mid-use.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from speedtronic.data.ingest import work


class _Done:
    def __init__(self, fn, arg):
        self._fn, self._arg = fn, arg

    def result(self) -> Any:
        return self._fn(self._arg)


class Inline:
    """One worker: the units are read and encoded here, when their result is asked for."""

    def __init__(self, setup: work.Setup):
        work.init(setup, worker=False)

    def submit(self, fn, arg) -> _Done:
        return _Done(fn, arg)

    def shutdown(self, **_: Any) -> None:
        pass


def make_pool(setup: work.Setup, workers: int) -> Any:
    if workers <= 1:
        return Inline(setup)
    context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(
        workers, mp_context=context, initializer=work.init, initargs=(setup,)
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
        yield item, (future.result() if future is not None else None)

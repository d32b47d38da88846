"""Subnormals flushed to zero on every thread torch computes on; each thread's flag given back.

``torch.set_flush_denormal`` sets the flag (x86 MXCSR's FTZ/DAZ bits) on the calling thread only,
while torch's CPU kernels (its ``parallel_for``, MKL, oneDNN) run on an OpenMP team. A worker
thread keeps the flag it had when the pool started it: with a pool from earlier torch work, the
workers compute the loop's backward with subnormals (20-30 ms a step on Intel, issue 55); with a
pool born inside the loop, they inherit the flag and keep flushing after it (a numerics bug).

So the loop runs one OpenMP parallel region (the runtime's ``GOMP_parallel``, through ctypes)
whose body runs on every thread of the team torch's own regions use: each thread notes its flag
and sets it; at the end a second region gives every thread its own flag back (a thread started
during the loop gets the calling thread's). Where no OpenMP runtime is loaded (another thread
pool, a platform without ``/proc/self/maps``), only the calling thread is set, as torch does.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

# The OpenMP runtimes torch wheels load; libomp and libiomp5 export GOMP_parallel too.
_RUNTIMES = ("libgomp", "libomp", "libiomp5")
_BODY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def thread_flushes() -> bool:
    """Whether the calling thread flushes subnormals: 1e-310 is subnormal in fp64."""
    return _divide(1e-300, 1e10) == 0.0


def _divide(a: float, b: float) -> float:  # arguments, so that nothing folds it at compile time
    return a / b


@functools.cache
def _openmp() -> Any:
    """The loaded OpenMP runtime's ``GOMP_parallel``, or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return None
    home = os.path.dirname(torch.__file__)
    # torch's own first: another package may load a runtime of its own, with its own pool
    for path in sorted(paths, key=lambda p: (not p.startswith(home), p)):
        if any(name in path.rsplit("/", 1)[-1] for name in _RUNTIMES):
            try:
                parallel = ctypes.CDLL(path).GOMP_parallel
            except (OSError, AttributeError):
                continue
            parallel.argtypes = [_BODY, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
            parallel.restype = None
            return parallel
    return None


def on_every_thread(body: Callable[[], None]) -> int:
    """Runs ``body`` once on each thread of torch's intra-op team; returns how many ran it.

    The team is ``torch.get_num_threads()`` strong, as in torch's own regions (a different size
    would make the runtime stop or start threads). ctypes drops the GIL for the call, and each
    thread takes it to run ``body``. An exception in ``body`` is raised here, after the region.
    """
    parallel = _openmp()
    if parallel is None:
        body()
        return 1
    ran: list[int] = []
    errors: list[BaseException] = []

    def run(_: Any) -> None:
        try:
            body()
            ran.append(threading.get_ident())
        except BaseException as exc:  # noqa: BLE001 - ctypes would print and drop it
            errors.append(exc)

    parallel(_BODY(run), None, torch.get_num_threads(), 0)
    if errors:
        raise errors[0]
    return len(ran)


@contextlib.contextmanager
def flushed_denormals(wanted: bool) -> Iterator[None]:
    """Subnormals flushed to zero on every pool thread inside; each thread's flag restored after."""
    if not wanted:
        yield
        return
    before: dict[int, bool] = {}

    def flush() -> None:
        before[threading.get_ident()] = thread_flushes()
        torch.set_flush_denormal(True)

    on_every_thread(flush)
    caller = before.get(threading.get_ident(), False)
    try:
        yield
    finally:
        on_every_thread(lambda: torch.set_flush_denormal(before.get(threading.get_ident(), caller)))

"""Issue 55, item 1: the loop flushes subnormals on every pool thread, then restores each one.

``torch.set_flush_denormal`` sets the calling thread's flag only. Each thread's flag is read by
behaviour: one parallel division whose result has a subnormal in every element, split by torch
into one chunk per pool thread; a thread that flushes writes zeros into its chunk.

Each scenario runs on a fresh Python thread, whose OpenMP pool is its own (the runtime keeps one
pool per calling thread): a pool started before ``fit()`` and one born inside it.
"""

from __future__ import annotations

import os
import threading

import pytest
import torch

from tests.train.test_flush_denormal import train_two_steps

THREADS = 2
CHUNK = 1 << 16  # above torch's grain size (32768): each thread of the team gets a chunk


def flushing_by_thread() -> list[bool]:
    """Per chunk of one parallel division (one chunk per pool thread): did it flush?"""
    n = torch.get_num_threads()
    quotient = torch.full((n * CHUNK,), 1e-30) / 1e10  # 1e-40: subnormal in fp32
    return [bool((part == 0).all()) for part in quotient.view(n, CHUNK)]


@pytest.fixture(autouse=True)
def two_threads():
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush subnormals (no SSE3 or denormal control)")
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("torch's intra-op pool is not OpenMP in this build")
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("the OpenMP runtime is found through /proc/self/maps, absent here")
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    yield
    torch.set_num_threads(threads)


class Spy:
    def __init__(self):
        self.seen = []

    def after_optimizer_step(self, trainer):
        self.seen.append(flushing_by_thread())


def fit(flush: bool = True) -> list[list[bool]]:
    return train_two_steps(Spy(), flush)


def on_fresh_thread(scenario):
    """``scenario()``'s result, run on a new thread (its own OpenMP pool, not yet started)."""
    out: dict = {}

    def run():
        try:
            out["value"] = scenario()
        except BaseException as exc:  # re-raised on the test's thread
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_a_pool_started_before_fit_flushes_on_every_thread_and_is_restored():
    def scenario():
        before = flushing_by_thread()  # starts this thread's pool, flag off everywhere
        during = fit()
        return before, during, flushing_by_thread()

    before, during, after = on_fresh_thread(scenario)
    assert before == [False] * THREADS
    assert during == [[True] * THREADS] * 2
    assert after == [False] * THREADS


def test_a_pool_born_inside_fit_stops_flushing_after_it():
    def scenario():
        during = fit()  # the pool's workers start while the calling thread flushes
        return during, flushing_by_thread()

    during, after = on_fresh_thread(scenario)
    assert during == [[True] * THREADS] * 2
    assert after == [False] * THREADS


def test_flush_denormal_false_leaves_every_thread_alone():
    def scenario():
        flushing_by_thread()
        return fit(flush=False), flushing_by_thread()

    during, after = on_fresh_thread(scenario)
    assert during == [[False] * THREADS] * 2
    assert after == [False] * THREADS


def test_threads_that_flushed_before_keep_flushing_after():
    def scenario():
        flushing_by_thread()
        torch.set_flush_denormal(True)  # the caller's choice, on its thread only
        try:
            fit()
            return flushing_by_thread()
        finally:
            torch.set_flush_denormal(False)

    caller, worker = on_fresh_thread(scenario)
    assert caller is True and worker is False


def test_a_region_runs_on_each_thread_of_the_team_and_raises_what_failed():
    from speedtronic.train.denormal import on_every_thread

    idents: list[int] = []
    assert on_every_thread(lambda: idents.append(threading.get_ident())) == THREADS
    assert len(set(idents)) == THREADS

    def fail():
        raise ValueError("body failed")

    with pytest.raises(ValueError, match="body failed"):
        on_every_thread(fail)


def test_without_an_openmp_runtime_the_calling_thread_alone_is_set(monkeypatch):
    from speedtronic.train import denormal

    monkeypatch.setattr(denormal, "_openmp", lambda: None)  # e.g. a build with another pool
    idents: list[int] = []
    assert denormal.on_every_thread(lambda: idents.append(threading.get_ident())) == 1
    assert idents == [threading.get_ident()]

"""Waiting on the test suite's subprocesses by their progress, not by the clock (issue 21).

On a shared machine (CI runners are; two suites or two busy loops on 2 cores) a run that
takes 5 s alone takes minutes, and a fixed timeout fails a correct test: the suite had two
such failures under load. These helpers wait as long as the process shows progress: it wrote
output, or its CPU time grew (a slow process still gets some CPU; a hung one, blocked on a
lock or a pipe, gets none). Only a process that shows neither for ``STALL_S`` seconds is
killed and reported, with the tail of what it printed. ``CEILING_S`` bounds everything, for a
process that spins without end. Both can be raised from the environment for very slow
machines (``SPEEDTRONIC_TEST_STALL_S``, ``SPEEDTRONIC_TEST_CEILING_S``).

Subprocesses of the suite also run with one intra-op thread (``quiet_env``): tiny models gain
nothing from more, and on a loaded machine every extra OpenMP thread waits for a time slice.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

STALL_S = float(os.environ.get("SPEEDTRONIC_TEST_STALL_S", "120"))
CEILING_S = float(os.environ.get("SPEEDTRONIC_TEST_CEILING_S", "1800"))
POLL_S = 0.05
CPU_EVERY_S = 1.0  # reading /proc for a process tree costs milliseconds: not at every poll


def quiet_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment, one OpenMP thread per process unless the caller says otherwise."""
    return {"OMP_NUM_THREADS": "1", **os.environ, **(extra or {})}


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) of ``pid`` and every process below it, the reaped ones
    included: ``bash -c "python ..."`` works in its child. None where /proc is absent."""
    stats: dict[int, tuple[int, int]] = {}  # pid -> (parent pid, clock ticks)
    try:
        entries = [e for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return None
    for entry in entries:
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        # after the command name: state, ppid, ...; utime, stime, cutime, cstime are 11-14
        stats[int(entry.name)] = (int(fields[1]), sum(int(f) for f in fields[11:15]))
    if pid not in stats:
        return None
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += stats[current][1]
        todo += [p for p, (parent, _) in stats.items() if parent == current]
    return total / os.sysconf("SC_CLK_TCK")


class Progress:
    """When ``proc`` last showed progress: output (``touch``) or CPU time it consumed."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.started = self.last = self.looked = time.monotonic()
        self.cpu = cpu_seconds(proc.pid)

    def touch(self) -> None:
        self.last = time.monotonic()

    def stalled(self) -> str | None:
        """Why to give up on the process (no progress for STALL_S, or CEILING_S), else None."""
        now = time.monotonic()
        if now - self.looked >= CPU_EVERY_S:
            self.looked, cpu = now, cpu_seconds(self.proc.pid)
            if cpu is not None and (self.cpu is None or cpu > self.cpu):
                self.cpu, self.last = cpu, now
        if now - self.last > STALL_S:
            return f"no output and no CPU time for {STALL_S:.0f} s: hung"
        if now - self.started > CEILING_S:
            return f"still running after {CEILING_S:.0f} s"
        return None


def _fail(proc: subprocess.Popen, why: str, out: str = "", err: str = "") -> None:
    proc.kill()
    proc.wait()
    pytest.fail(f"{proc.args}: {why}\n--- stdout (tail)\n{out[-2000:]}\n--- stderr\n{err[-3000:]}")


def run(
    command: Sequence[str], *, env: dict[str, str] | None = None, cwd: str | Path | None = None
) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True)``, waiting by progress.

    Standard input is empty: a test process never reads the terminal pytest runs in.
    """
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    progress = Progress(proc)
    chunks: dict[str, list[str]] = {"out": [], "err": []}

    def drain(stream, into: list[str]) -> None:
        for line in iter(stream.readline, ""):
            into.append(line)
            progress.touch()

    readers = [
        threading.Thread(target=drain, args=(proc.stdout, chunks["out"]), daemon=True),
        threading.Thread(target=drain, args=(proc.stderr, chunks["err"]), daemon=True),
    ]
    for reader in readers:
        reader.start()
    while proc.poll() is None:
        why = progress.stalled()
        if why:
            _fail(proc, why, "".join(chunks["out"]), "".join(chunks["err"]))
        time.sleep(POLL_S)
    for reader in readers:
        reader.join()
    out, err = "".join(chunks["out"]), "".join(chunks["err"])
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def wait(proc: subprocess.Popen) -> int:
    """``proc.wait()`` for as long as the process shows progress; its exit code."""
    progress = Progress(proc)
    while proc.poll() is None:
        why = progress.stalled()
        if why:
            _fail(proc, why)
        time.sleep(POLL_S)
    return proc.returncode


def communicate(proc: subprocess.Popen) -> tuple[str, str]:
    """``proc.communicate()`` for as long as the process shows progress."""
    result: dict[str, tuple[str, str]] = {}
    reader = threading.Thread(target=lambda: result.update(io=proc.communicate()), daemon=True)
    reader.start()
    wait(proc)
    reader.join()
    return result["io"]


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen) -> None:
    """Wait until ``condition()`` holds; fail if ``proc`` exits first or stops progressing."""
    progress = Progress(proc)
    while not condition():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(
                f"{proc.args} exited ({proc.returncode}) first:\n{(out or '')[-2000:]}"
                f"\n{(err or '')[-3000:]}"
            )
        why = progress.stalled()
        if why:
            _fail(proc, why)
        time.sleep(POLL_S)

"""The CPU threads a run computes with (``run.threads``), and the notice when it gets few of them.

On cores that other processes keep busy, torch's intra-op threads wait for each other at every
parallel region's end: on 2 cores at load 8-10, training ran 10-15x slower with torch's default
2 threads than with 1 (issue 55). ``CpuShareNotice`` measures the first steps as ``bench`` does
(process CPU time / (wall time * threads), ``bench``'s CPU share, data waits left out) and, once,
when the process got under ``BUSY_SHARE`` of the CPU time its threads asked for, names the remedy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

# Under this CPU share the threads mostly wait for cores other processes hold. bench calls a
# measurement disturbed under 0.90 (bench.CONTENDED); a training loop's own single-threaded
# moments (Python, data, the clip's norm) lower its share on a quiet machine too, hence half.
BUSY_SHARE = 0.5
MEASURE_STEPS = 5  # steps measured, after the first (allocations, the first batch)
MEASURE_S = 2.0  # and at least this much wall time, so one scheduler hiccup cannot decide it


def use_threads(threads: int | None) -> None:
    """torch's intra-op threads: ``threads``, or torch's default (one per core) for None or 0."""
    if threads:
        torch.set_num_threads(threads)


def cpu_share(cpu_s: float, wall_s: float, threads: int) -> float:
    """The CPU time a process got of what its threads asked for (bench's rule)."""
    return cpu_s / max(wall_s * threads, 1e-9)


def busy_message(share: float, threads: int, steps: int) -> str:
    return (
        f"this process got {share:.0%} of the CPU time its {threads} threads asked for over "
        f"{steps} steps: other processes are busy on these cores, and torch's threads wait "
        "for each other; on a busy machine training is often several times faster with "
        "--threads 1 (run.threads, or OMP_NUM_THREADS=1): docs/troubleshooting.md"
    )


class CpuShareNotice:
    """A Trainer plug-in: one notice when the first steps got under ``BUSY_SHARE`` of the CPU.

    ``clock`` and ``cpu_time`` are injectable (tests); ``log`` takes the one-line message.
    """

    name = "cpu_share"  # every plug-in has one (train/parallel picks plug-ins by it)

    def __init__(
        self,
        log: Callable[[str], None],
        threads: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
        cpu_time: Callable[[], float] = time.process_time,
    ):
        self.log, self.clock, self.cpu_time = log, clock, cpu_time
        self.threads = threads or torch.get_num_threads()
        self.start: tuple[float, float, float] | None = None  # wall, cpu, data wait
        self.steps = 0
        self.done = self.threads < 2  # one thread waits for no other: nothing to suggest

    def after_optimizer_step(self, trainer: Any) -> None:
        if self.done:
            return
        now = (self.clock(), self.cpu_time(), trainer.step_log.waited())
        if self.start is None:
            self.start = now
            return
        self.steps += 1
        wall = now[0] - self.start[0] - (now[2] - self.start[2])
        if self.steps < MEASURE_STEPS or wall < MEASURE_S:
            return
        self.done = True
        share = cpu_share(now[1] - self.start[1], wall, self.threads)
        if share < BUSY_SHARE:
            self.log(busy_message(share, self.threads, self.steps))

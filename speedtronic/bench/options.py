"""How long and how big a bench run measures: ``BenchOptions`` and the defaults it implies.

This module owns the user-facing knobs of ``speedtronic bench`` (quick or full, matmul size,
copy buffer, seconds per timed measurement, rounds, scratch directory) and the defaults that
follow from them per device.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BenchOptions:
    """How long and how big. ``None`` picks the default for the device and mode (quick/full)."""

    quick: bool = False
    # The largest square matmul side; default 2048 CPU, 8192 CUDA, 4096 MPS. Smaller when one
    # call would not fit the stage's time box (an emulated dtype: see plan.fit_matmul_size).
    matmul_size: int | None = None
    copy_mib: int | None = None  # memory copy buffer; default 256 CPU, 1024 GPU
    min_time_s: float | None = None  # each timed measurement (one model round, one matmul
    # dtype, the copy, the loader) runs at least this long; default 0.7 quick, 2.0 full
    rounds: int | None = None  # timed rounds per model side; default 5 (quick rounds are shorter)
    scratch_dir: str | None = None  # where the checkpoint is written (default: system temp)

    @property
    def seconds(self) -> float:
        if self.min_time_s is not None:
            return self.min_time_s
        return 0.7 if self.quick else 2.0

    @property
    def timed_rounds(self) -> int:
        return self.rounds or 5

    @property
    def warmup_steps(self) -> int:
        """Untimed steps after the first one; they also estimate the step time."""
        return 2 if self.quick else 3

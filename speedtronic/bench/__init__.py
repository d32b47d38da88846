"""Device and engine measurements behind ``speedtronic bench``, and the raw-loop baseline.

This package owns what ``bench`` measures and how. ``run_bench`` returns one JSON-ready
document (``SCHEMA_VERSION``; keys documented in ``docs/benchmarks.md``) and ``verdicts`` turns
a document into one short judgement per line. Progress is reported as ``(event, payload)``
pairs; rendering belongs to the CLI. The modules:

- ``probes``: timing primitives, device facts, matmul/copy peaks, peak memory.
- ``raw``: ``RawLoop``, the hand-written loop the Trainer is compared with (shared with
  ``benchmarks/engine/overhead.py``), and the ABBA-alternated timed rounds.
- ``options``: ``BenchOptions``, how long and how big.
- ``context``: the state one run shares between stages, and stage progress events.
- ``plan``: the dtype probe, and the sizes and time boxes of every stage derived from it
  (an emulated bf16 must cost seconds, not minutes: issue 10).
- ``modes``: the model through the Trainer in every precision mode; overhead and MFU.
- ``sections``: checkpoint, torch.compile and data loader stages.
- ``run``: ``run_bench``, the stages in order and the final document.
- ``verdict_rules``: the document -> verdict lines rules and thresholds.
"""

from __future__ import annotations

from speedtronic.bench.context import SCHEMA_VERSION, BenchContext, Progress
from speedtronic.bench.options import BenchOptions
from speedtronic.bench.probes import (
    MODES,
    PEAK_REPEATS,
    cpu_flags,
    cpu_name,
    device_facts,
    matmul_dtypes,
    measure_copy,
    measure_matmul,
    peak_memory_gb,
    repeat_timed,
    reset_peak_memory,
    supported_modes,
    synchronize,
    timed,
    vendor_tflops,
)
from speedtronic.bench.raw import (
    IDLE_SHARE,
    RawLoop,
    Timings,
    alternate,
    build_raw,
    check_same_weights,
    drop_checkpoints,
    endless,
    ratio_stats,
    run_trainer,
    weights_fingerprint,
)
from speedtronic.bench.run import json_safe, run_bench
from speedtronic.bench.verdict_rules import (
    CHECKPOINT_COST_WARN,
    CONTENDED,
    HEADROOM_OK,
    OVERHEAD_OK,
    OVERHEAD_WARN,
    WORTH_SWITCHING,
    times,
    verdicts,
)

__all__ = [
    "CHECKPOINT_COST_WARN",
    "CONTENDED",
    "HEADROOM_OK",
    "IDLE_SHARE",
    "MODES",
    "OVERHEAD_OK",
    "OVERHEAD_WARN",
    "PEAK_REPEATS",
    "SCHEMA_VERSION",
    "WORTH_SWITCHING",
    "BenchContext",
    "BenchOptions",
    "Progress",
    "RawLoop",
    "Timings",
    "alternate",
    "build_raw",
    "check_same_weights",
    "cpu_flags",
    "cpu_name",
    "device_facts",
    "drop_checkpoints",
    "endless",
    "json_safe",
    "matmul_dtypes",
    "measure_copy",
    "measure_matmul",
    "peak_memory_gb",
    "ratio_stats",
    "repeat_timed",
    "reset_peak_memory",
    "run_bench",
    "run_trainer",
    "supported_modes",
    "synchronize",
    "timed",
    "times",
    "vendor_tflops",
    "verdicts",
    "weights_fingerprint",
]

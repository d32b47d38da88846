"""The staged bench run: ``run_bench`` drives the stages in order and returns one document.

This module owns the order of the stages (device facts, the model in every precision mode,
checkpoint, torch.compile, data loader, and the physical limits last), the scratch directory's
life, the physical-limit stages (matmul per dtype, memory copy), and the final document:
MFU filled in, verdicts added, keys in schema order, strict JSON (non-finite floats as null).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from speedtronic.bench.context import BenchContext, Progress
from speedtronic.bench.modes import add_mfu, model_stages
from speedtronic.bench.options import BenchOptions
from speedtronic.bench.plan import is_emulated, peak_matmul_size, probe_section
from speedtronic.bench.probes import PEAK_REPEATS, measure_copy, measure_matmul, vendor_tflops
from speedtronic.bench.sections import checkpoint_section, compile_section, data_section
from speedtronic.bench.verdict_rules import verdicts
from speedtronic.config import SpeedtronicConfig
from speedtronic.errors import ConfigError
from speedtronic.train.precision import emulation_warning

DOC_KEYS = ("schema_version", "quick", "elapsed_s", "config", "device", "probe", "peaks")
DOC_KEYS += ("model", "overhead", "data", "checkpoint", "compile", "verdicts")


def run_bench(
    config: Any, options: BenchOptions | None = None, progress: Progress | None = None
) -> dict[str, Any]:
    """Measure everything for ``config`` (object, dict, path or YAML) on its ``run.device``."""
    ctx = BenchContext(SpeedtronicConfig.load(config), options or BenchOptions(), progress)
    start = time.perf_counter()
    where = ctx.options.scratch_dir
    if where is not None and not Path(where).is_dir():
        raise ConfigError(f"--scratch-dir: {where} is not an existing directory")
    ctx.scratch = Path(tempfile.mkdtemp(prefix="speedtronic-bench-", dir=where))
    try:
        _run_stages(ctx)
    finally:
        shutil.rmtree(ctx.scratch, ignore_errors=True)
    add_mfu(ctx)
    ctx.doc["elapsed_s"] = time.perf_counter() - start
    ctx.doc["verdicts"] = verdicts(ctx.doc)
    return json_safe({key: ctx.doc[key] for key in DOC_KEYS})


def _run_stages(ctx: BenchContext) -> None:
    # Training first: the matmul and copy stages free 16-256 MB buffers, which raises
    # glibc's mmap/trim thresholds and would make later CPU steps faster than in a
    # `speedtronic train` process (measured: up to ~15% on the smoke model).
    ctx.stage("device facts and dtype probe", lambda: _device_stage(ctx))
    trained = model_stages(ctx)
    work = lambda: checkpoint_section(ctx, trained)  # noqa: E731
    ctx.doc["checkpoint"] = ctx.stage("checkpoint save/load", work)
    trained = None  # free the last model and optimizer before the next stages
    ctx.doc["compile"] = compile_section(ctx)
    ctx.doc["data"] = ctx.stage("data loader", lambda: data_section(ctx))
    ctx.doc["peaks"] = peaks_section(ctx)


def _device_stage(ctx: BenchContext) -> None:
    """Device facts, and a milliseconds probe per dtype that sizes the later stages.

    The configured mode's emulation gets the warning `train` gives. The other modes' is no
    warning: their ``precision.mode:`` wording would read as a fault of the user's config (issue
    21), and the table's lines already say which dtype is emulated and how much it costs.
    """
    ctx.doc["device"] = ctx.facts
    ctx.doc["probe"] = probe_section(ctx)
    message = emulation_warning(ctx.device, ctx.configured)
    if message:
        ctx.warn(message)


def peaks_section(ctx: BenchContext) -> dict[str, Any]:
    """Square-matmul peaks per dtype, memory copy bandwidth and the vendor table's peaks."""
    peaks: dict[str, Any] = {"matmul": dict.fromkeys(("fp32", "tf32", "bf16", "fp16"))}
    for name in ctx.dtypes:
        label = f"matmul {name}" + (" (emulated)" if is_emulated(ctx, name) else "")
        peaks["matmul"][name] = ctx.stage(label, lambda n=name: _matmul_peak(ctx, n))
    mib = ctx.options.copy_mib or (256 if ctx.device.type == "cpu" else 1024)
    work = lambda: measure_copy(mib, ctx.device, ctx.options.seconds, PEAK_REPEATS)  # noqa: E731
    peaks["memory_copy"] = ctx.stage("memory copy", work)
    peaks["vendor_tflops"] = vendor_tflops(ctx.facts)
    return peaks


def _matmul_peak(ctx: BenchContext, name: str) -> dict[str, Any]:
    """The peak at the largest size (up to the default) whose calls fit the stage's time box."""
    size = peak_matmul_size(ctx, name, matmul_size(ctx))
    return measure_matmul(name, size, ctx.device, ctx.options.seconds, PEAK_REPEATS)


def matmul_size(ctx: BenchContext) -> int:
    """The largest matmul side measured: ``--matmul-size``, else 2048 CPU, 8192 CUDA, 4096 MPS."""
    default = {"cuda": 8192, "mps": 4096}.get(ctx.device.type, 2048)
    return ctx.options.matmul_size or default


def json_safe(value: Any) -> Any:
    """Non-finite floats become None, so the document is strict JSON."""
    if isinstance(value, float) and not (value == value and abs(value) != float("inf")):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value

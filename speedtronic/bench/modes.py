"""The configured model through the real Trainer, in every precision mode the device trains in.

This module owns the model stages of a bench run: building the configured run without log
files, hooks, checkpoints or DiLoCo; an untimed warm-up; timed rounds of ``Trainer.fit()``
(alternated with the hand-written ``RawLoop`` in the configured mode, for the engine-overhead
line); and the resulting ``model``, ``overhead`` and ``config`` sections, with MFU against the
measured matmul peaks once those are known.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from speedtronic.bench.context import BenchContext
from speedtronic.bench.plan import is_emulated, mode_budget, round_plan, skip_reason, warm_steps
from speedtronic.bench.probes import peak_memory_gb, reset_peak_memory, synchronize, timed
from speedtronic.bench.raw import (
    Timings,
    alternate,
    build_raw,
    drop_checkpoints,
    ratio_stats,
    run_trainer,
    weights_fingerprint,
)
from speedtronic.config import SpeedtronicConfig
from speedtronic.runtime import Runtime, build_runtime, count_parameters


class _Events:
    """A MetricLogger hook that keeps train_step payloads and warnings of one runtime."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.warnings: list[str] = []

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        if event == "train_step":
            self.steps.append(payload)
        elif event == "warning":
            self.warnings.append(str(payload.get("message")))


@dataclass
class ModeRun:
    runtime: Runtime
    row: dict[str, Any]
    overhead: dict[str, Any] | None
    first_s: float  # the first optimizer step, compilation included when compile is on
    events: _Events


def model_stages(ctx: BenchContext) -> Runtime:
    """Measure every mode (the configured one first, against the raw loop) into ``ctx.doc``.

    A mode the probe finds emulated and too slow to measure in its time box is listed under
    ``model.skipped`` with the reason instead. Returns the configured mode's runtime, or the
    last measured one's: its trained weights and AdamW state feed the checkpoint stage (the
    saved state is the same in every precision mode).
    """
    modes: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    ctx.doc["model"] = {"configured": ctx.configured, "modes": modes, "skipped": skipped}
    runtime = None
    for mode in ctx.modes:
        reason = skip_reason(ctx, mode)
        if reason is not None:
            ctx.stage(f"model {mode} (emulated: skipped)", lambda r=reason: ctx.notice(r))
            skipped[mode] = reason
            continue
        first = mode == ctx.configured  # measured first, against the raw loop
        label = f"model {mode}" + (" + raw PyTorch loop" if first else "")
        runtime = None  # free the previous mode's model and optimizer first
        run = ctx.stage(label, lambda m=mode, f=first: measure_mode(ctx, m, with_raw=f))
        modes[mode] = run.row
        if first:
            ctx.doc["config"] = config_facts(ctx, run.runtime)
            ctx.doc["overhead"] = run.overhead
        runtime, run = run.runtime, None
    base = modes[ctx.configured]["tokens_per_s"]
    for row in modes.values():
        row["speedup_vs_configured"] = row["tokens_per_s"] / base
    assert runtime is not None  # the configured mode is always measured
    return runtime


def bench_runtime(ctx: BenchContext, mode: str, events: _Events, compile: bool = False) -> Runtime:
    """The configured run in ``mode``: no log files, hooks, checkpoints or DiLoCo."""
    raw = ctx.config.to_dict(redact=False)
    raw["run"].update(device=str(ctx.device), output_dir=str(ctx.scratch / "run"))
    raw["precision"] = {"mode": mode}
    raw["compile"] = compile
    raw["logging"].update(file=None, json_file=None, hooks=[])
    raw["data"]["eval_every"] = 0  # evaluation is not training throughput
    raw["checkpoint"].update(interval=0, resume=False, directory=str(ctx.scratch / "ckpt"))
    raw["distributed"]["enabled"] = False
    runtime = build_runtime(SpeedtronicConfig.from_dict(raw), console=False, hooks=[events])
    drop_checkpoints(runtime)
    runtime.trainer.options.handle_signals = False  # Ctrl-C ends the bench at once: 130
    return runtime


def measure_mode(ctx: BenchContext, mode: str, with_raw: bool, compile: bool = False) -> ModeRun:
    """Warm up (untimed), then time rounds of Trainer steps (alternated with the raw loop).

    Time-boxed: fewer warm-up steps and rounds when steps are slow (``plan``), so an emulated
    dtype costs seconds, not minutes.
    """
    events = _Events()
    reset_peak_memory(ctx.device)
    runtime = bench_runtime(ctx, mode, events, compile)
    # The raw loop is built after the Trainer's warm-up, so it is not in its peak memory.
    initial = weights_fingerprint(runtime.model) if with_raw else None
    first_s = timed(lambda: run_trainer(runtime, 1), ctx.device)
    # A compiled first step is mostly compilation: the eager step says how slow steps are.
    warm = warm_steps(ctx.configured_row()["step_time_s"] if compile else first_s, ctx)
    step_s = timed(lambda: run_trainer(runtime, warm), ctx.device) / warm
    memory = peak_memory_gb(ctx.device)
    steps, rounds = round_plan(step_s, ctx)
    raw = None
    if with_raw:
        raw = build_raw(runtime.config, runtime, fingerprint=initial)
        raw.run(1 + warm)  # the same warm-up as the Trainer had
    events.steps.clear()
    sides = 2 if with_raw else 1
    timings = alternate(runtime, raw, 0, steps, rounds, budget_s=mode_budget(ctx) * sides)
    for message in events.warnings:
        if mode == ctx.configured or not message.startswith("precision.mode:"):
            ctx.warn(message)  # not another mode's precision warning: see run._device_stage
    row = mode_row(mode, runtime, timings, memory, events)
    row["optimizer_share"] = optimizer_share(runtime, steps, ctx.device)
    overhead = overhead_section(mode, timings, steps) if raw is not None else None
    return ModeRun(runtime, row, overhead, first_s, events)


def optimizer_share(runtime: Runtime, steps: int, device: torch.device) -> float:
    """The share of a Trainer step spent in ``optimizer.step``, over ``steps`` more steps.

    Measured after the timed rounds, which run free: here the device is synchronised around
    each optimizer step (on a GPU that costs a little throughput, so it is not done there).
    """
    optimizer, spent = runtime.optimizer, [0.0]
    inner = optimizer.step  # the LR scheduler's wrapper: wraps() keeps its mark

    @functools.wraps(inner)
    def timed_step(*args: Any, **kwargs: Any) -> Any:
        synchronize(device)
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            synchronize(device)
            spent[0] += time.perf_counter() - start

    optimizer.step = timed_step
    try:
        total = timed(lambda: run_trainer(runtime, steps), device)
    finally:
        optimizer.step = inner
    return min(1.0, spent[0] / total) if total > 0 else 0.0


def mode_row(
    mode: str, runtime: Runtime, timings: Timings, memory: float | None, events: _Events
) -> dict[str, Any]:
    tokens_per_s = statistics.median(timings.rates("trainer"))
    waits = [s["data_wait_share"] for s in events.steps if "data_wait_share" in s]
    shares = timings.shares("trainer")
    return {
        "precision": mode,
        "tokens_per_s": tokens_per_s,
        "step_time_s": runtime.config.tokens_per_step / tokens_per_s,
        "steps": timings.tokens // runtime.config.tokens_per_step * len(shares),
        "mfu_measured_peak": None,  # filled in by add_mfu
        "mfu_vendor_peak": None,
        "peak_memory_gb": memory,
        "data_wait_share": statistics.median(waits) if waits else None,
        "cpu_share": statistics.median(shares) if timings.on_cpu else None,
        "optimizer_share": None,  # filled in by optimizer_share, after the timed rounds
        "speedup_vs_configured": 1.0,
        "final_loss": runtime.trainer.last_loss,
    }


def overhead_section(mode: str, timings: Timings, steps: int) -> dict[str, Any]:
    stats = ratio_stats(timings)
    return {
        "precision": mode,
        "trainer_tokens_per_s": statistics.median(timings.rates("trainer")),
        "raw_tokens_per_s": statistics.median(timings.rates("raw")),
        "ratio": stats["ratio"],
        "ratio_min": stats["ratio_min"],
        "ratio_max": stats["ratio_max"],
        "ratio_clean": stats["ratio_clean"],
        "clean_rounds": stats["clean_rounds"],
        "rounds": len(stats["round_ratios"]),
        "steps_per_round": steps,
    }


def config_facts(ctx: BenchContext, runtime: Runtime) -> dict[str, Any]:
    cfg = runtime.config
    return {
        "name": cfg.run.name,
        "model": cfg.model.name,
        "params": count_parameters(runtime.model),
        "flops_per_token": runtime.trainer.options.flops_per_token,
        "tokens_per_step": cfg.tokens_per_step,
        "micro_batch_size": cfg.data.micro_batch_size,
        "accumulation_steps": cfg.accumulation_steps,
        "seq_len": cfg.seq_len,
        "precision": ctx.configured,
        "compile": ctx.config.compile,
        "optimizer": runtime.optimizer_kernel,
    }


def add_mfu(ctx: BenchContext) -> None:
    """MFU of every mode, once the peaks are measured (they are timed last)."""
    flops = ctx.doc["config"]["flops_per_token"]
    for mode, row in ctx.doc["model"]["modes"].items():
        # An emulated dtype's "peak" is no peak: its matmul was cut to a size that fits the
        # time box, where emulation can run slower than the model's smaller matmuls (MFU of
        # 355% was seen). MFU against it would mislead: n/a.
        measured = None if is_emulated(ctx, mode) else measured_peak(ctx, mode)
        vendor_key = "fp32" if mode == "fp32" else "low_precision"
        vendor = ctx.doc["peaks"]["vendor_tflops"][vendor_key]
        tokens_per_s = row["tokens_per_s"]
        row["mfu_measured_peak"] = flops * tokens_per_s / measured if measured else None
        row["mfu_vendor_peak"] = flops * tokens_per_s / (vendor * 1e12) if vendor else None


def measured_peak(ctx: BenchContext, mode: str) -> float | None:
    name = mode
    if mode == "fp32" and ctx.device.type == "cuda" and _tf32_enabled():
        name = "tf32"
    peak = ctx.doc["peaks"]["matmul"].get(name)
    return peak["tflops"] * 1e12 if peak else None


def _tf32_enabled() -> bool:
    """Whether fp32 matmuls in training run as TF32 (the user may have allowed it)."""
    precision = torch.get_float32_matmul_precision()
    return bool(torch.backends.cuda.matmul.allow_tf32) or precision != "highest"

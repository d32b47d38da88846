"""Sizing and time-boxing every stage from a quick probe of each dtype, so no stage runs away.

This module owns the ``probe`` section (a small matmul per dtype, milliseconds, which says how
much slower than fp32 each low-precision dtype is and whether it is emulated), the matmul size
ladder (the largest square matmul whose single call fits the stage's time box), the step and
round counts of a model stage (as many timed rounds as fit its box, however slow a step is),
and the rule that skips a precision mode predicted to be too slow to measure at all. Why: on a
CPU without bf16 arithmetic one 2048x2048 bf16 matmul block took 257 s and ``bench --quick``
383 s (issue 10); every stage must stay within a bound that depends on the options alone.
"""

from __future__ import annotations

from typing import Any

import torch

from speedtronic.bench.context import BenchContext
from speedtronic.bench.probes import PEAK_REPEATS, time_matmul_call
from speedtronic.train import emulation, precision

LADDER_START = 256  # first matmul side of the size ladder when no probe seeds it
SLACK = 1.25  # a model stage's timed rounds may run this much over their nominal time
MAX_STEPS_PER_ROUND = 10_000


# ---- the probe ----------------------------------------------------------------------------


def probe_section(ctx: BenchContext) -> dict[str, Any]:
    """Per matmul dtype (TF32 aside): probe size, seconds per call, slowdown against fp32."""
    return {name: probe_entry(ctx.device, name) for name in ctx.dtypes if name != "tf32"}


def probe_entry(device: torch.device, mode: str) -> dict[str, Any] | None:
    try:
        if mode == "fp32":
            slowdown, probe = 1.0, precision.probe_matmul(device, "fp32")
        else:  # the module's function, not a copy: train-start warnings use the same numbers
            slowdown, probe = precision.matmul_slowdown(device, mode)
    except RuntimeError:  # a backend without this dtype's matmul: nothing to size from
        return None
    entry: dict[str, Any] = {"size": probe.size, "seconds": probe.seconds}
    entry["slowdown_vs_fp32"] = slowdown
    # Only CPUs emulate; a GPU's tiny matmuls are launch-bound and say nothing of the kind.
    # The machine's cached verdict, not this probe: one busy moment must not flip it (issue 40).
    found = emulation.verdict(mode) if device.type == "cpu" and mode != "fp32" else None
    entry["emulated"] = bool(found and found.emulated)
    entry["verdict"] = found and {
        "basis": found.basis,
        "reason": found.reason(),
        "cache": found.cache,
    }
    return entry


def is_emulated(ctx: BenchContext, mode: str) -> bool:
    entry = ctx.doc.get("probe", {}).get(mode)
    return bool(entry and entry["emulated"])


# ---- matmul sizes -------------------------------------------------------------------------


def matmul_call_budget(ctx: BenchContext) -> float:
    """Seconds one peak matmul call may take: two per timed block, at the default timing."""
    return 2 * ctx.options.seconds / PEAK_REPEATS


def fit_matmul_size(
    name: str, device: torch.device, largest: int, budget: float, start: int
) -> int:
    """The largest side up to ``largest`` whose measured ``name`` matmul call fits ``budget``.

    Climbs in doubling steps and runs a size only when the last measured call predicts it
    within budget (n^3 work); a size that still overruns (emulation can get slower per flop
    as matrices grow: 2.6 GFLOP/s at 512, 0.3 at 2048) is dropped after its first call. A
    ``largest`` that is not a power of two (``--matmul-size``) is tried last the same way.
    """
    size = min(start, largest)
    seconds = time_matmul_call(name, size, device, give_up_s=budget)
    for bigger in _ladder(size, largest):
        if seconds * (bigger / size) ** 3 > budget:
            break
        measured = time_matmul_call(name, bigger, device, give_up_s=budget)
        if measured > budget:
            break
        size, seconds = bigger, measured
    return size


def _ladder(size: int, largest: int) -> list[int]:
    """Doublings of ``size`` up to ``largest``, then ``largest`` itself if not among them."""
    sizes = []
    while size * 2 <= largest:
        size *= 2
        sizes.append(size)
    return sizes + ([largest] if size < largest else [])


def peak_matmul_size(ctx: BenchContext, name: str, largest: int) -> int:
    """The matmul side for ``name``'s peak: ``largest`` unless a call would overrun the box.

    The probe predicts the call; only a dtype that is emulated or predicted over budget
    climbs the size ladder (``fit_matmul_size``), from the probe's size.
    """
    budget = matmul_call_budget(ctx)
    entry = ctx.doc.get("probe", {}).get("fp32" if name == "tf32" else name)
    if entry and not entry["emulated"] and _predicted_call_s(entry, largest) <= budget:
        return largest  # the usual case: no ladder, so a busy machine cannot shrink the size
    start = min(entry["size"], LADDER_START) if entry else LADDER_START
    return fit_matmul_size(name, ctx.device, largest, budget, start)


def _predicted_call_s(entry: dict[str, Any], size: int) -> float:
    """One call at ``size``, scaled from the probe's call (n^3 work).

    On CPU the probe ran on one thread, so with several threads this overestimates: the
    safe side to err on.
    """
    return entry["seconds"] * (size / entry["size"]) ** 3


# ---- model stages -------------------------------------------------------------------------


def mode_budget(ctx: BenchContext) -> float:
    """Seconds the timed rounds of one side (Trainer or raw loop) of a model stage may take."""
    return ctx.options.seconds * ctx.options.timed_rounds * SLACK


def warm_steps(step_guess_s: float, ctx: BenchContext) -> int:
    """Untimed steps after the first: the usual count, fewer when steps are very slow."""
    affordable = int(ctx.options.seconds // max(step_guess_s, 1e-9))
    return max(1, min(ctx.options.warmup_steps, affordable))


def round_plan(step_s: float, ctx: BenchContext) -> tuple[int, int]:
    """``(steps per round, rounds)``: rounds of about ``seconds``, as many as fit the budget.

    A step slower than a round gives one-step rounds, and then fewer rounds (at least one),
    so the stage's timed part stays near ``mode_budget`` per side. ``alternate`` also stops
    starting rounds at the budget, for steps slower than the warm-up predicted.
    """
    seconds = ctx.options.seconds
    steps = min(MAX_STEPS_PER_ROUND, max(1, round(seconds / step_s)))
    fits = int(mode_budget(ctx) // (steps * step_s))
    return steps, max(1, min(ctx.options.timed_rounds, fits))


def predicted_step_s(ctx: BenchContext, mode: str) -> float | None:
    """A non-configured mode's step time, from the configured one and the probe's slowdowns."""
    probe = ctx.doc.get("probe", {})
    entry, base = probe.get(mode), probe.get(ctx.configured)
    if not entry or not base:
        return None
    ratio = entry["slowdown_vs_fp32"] / base["slowdown_vs_fp32"]
    return ctx.configured_row()["step_time_s"] * ratio


def skip_reason(ctx: BenchContext, mode: str) -> str | None:
    """Why an emulated, non-configured mode is not measured; None to measure it.

    Measuring takes a first step, a warm-up step and one timed step at the least: when the
    probe predicts those three over the stage's budget, the mode is reported, not measured.
    The configured mode is always measured: every later stage compares with it.
    """
    if mode == ctx.configured or not is_emulated(ctx, mode):
        return None
    step_s = predicted_step_s(ctx, mode)
    if step_s is None or 3 * step_s <= mode_budget(ctx):
        return None
    entry = ctx.doc["probe"][mode]
    size = f"{entry['size']}x{entry['size']}"
    return (
        f"{mode} is emulated on this {ctx.device.type.upper()} ({entry['slowdown_vs_fp32']:.0f}x"
        f" slower than fp32 in a {size} probe matmul): a step would take about {step_s:.1f} s"
    )

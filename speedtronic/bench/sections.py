"""The bench stages around the model: checkpoint bandwidth, torch.compile, data loader headroom.

This module owns the ``checkpoint``, ``compile`` and ``data`` sections of a bench document:
``save_checkpoint`` / ``load_checkpoint`` of a trained runtime in a scratch directory, the
configured mode again with ``torch.compile`` on (compile time and compiled tokens/s), and the
configured data loader read alone as fast as it goes against the rate training consumes.
"""

from __future__ import annotations

import shutil
import statistics
import time
from typing import Any

import torch

from speedtronic.bench.context import BenchContext
from speedtronic.bench.modes import measure_mode
from speedtronic.bench.probes import timed
from speedtronic.checkpoint import load_checkpoint, save_checkpoint
from speedtronic.data import DataStream, build_dataloader
from speedtronic.runtime import Runtime, count_parameters
from speedtronic.train.trainer import batch_size_of

COMPILE_KEYS = ("precision", "first_step_s", "compile_s", "eager_tokens_per_s")
COMPILE_KEYS += ("compiled_tokens_per_s", "speedup", "fell_back", "message")


def checkpoint_section(ctx: BenchContext, runtime: Runtime) -> dict[str, Any]:
    """Save (state_dict collection included, as a run's save) and load, to a scratch dir."""
    trainer, model, root = runtime.trainer, runtime.model, ctx.scratch / "checkpoints"
    meta = {
        "run_id": "bench",
        "tokens": trainer.tokens,
        "samples": trainer.samples,
        "loss": trainer.current_loss(),
        "param_count": count_parameters(model),
        "config": runtime.config.to_dict(redact=True),
    }
    saves, loads, paths = [], [], []
    for _ in range(2 if ctx.options.quick else 3):
        shutil.rmtree(root, ignore_errors=True)  # every save starts from the same state

        def save() -> None:
            state = trainer.state_dict()
            paths.append(save_checkpoint(root, trainer.step, model.state_dict(), state, meta))

        saves.append(timed(save, ctx.device))
        loads.append(timed(lambda: load_checkpoint(paths[-1]), ctx.device))
    size = sum(f.stat().st_size for f in paths[-1].iterdir() if f.is_file())
    save_s, load_s = statistics.median(saves), statistics.median(loads)
    return {
        "bytes": size,
        "save_s": save_s,
        "load_s": load_s,
        "save_gb_per_s": size / save_s / 1e9,
        "load_gb_per_s": size / load_s / 1e9,
        "repeats": len(saves),
        "interval": ctx.config.checkpoint.interval,
        "directory": str(ctx.scratch.parent),
    }


def compile_section(ctx: BenchContext) -> dict[str, Any]:
    """The configured mode with torch.compile on, against its eager measurement."""
    section: dict[str, Any] = {"enabled": ctx.config.compile, **dict.fromkeys(COMPILE_KEYS)}
    if not ctx.config.compile:
        return section
    mode = ctx.configured
    work = lambda: measure_mode(ctx, mode, with_raw=False, compile=True)  # noqa: E731
    run = ctx.stage(f"model {mode} with torch.compile", work)
    eager = ctx.configured_row()
    failed = [w for w in run.events.warnings if "torch.compile" in w]
    section.update(
        precision=mode,
        first_step_s=run.first_s,
        compile_s=max(0.0, run.first_s - eager["step_time_s"]),
        eager_tokens_per_s=eager["tokens_per_s"],
        compiled_tokens_per_s=run.row["tokens_per_s"],
        speedup=run.row["tokens_per_s"] / eager["tokens_per_s"],
        fell_back=bool(failed),
        message=failed[0] if failed else None,
    )
    return section


def data_section(ctx: BenchContext) -> dict[str, Any]:
    """The configured loader alone, read as fast as possible, against the model's rate."""
    loader = build_dataloader(ctx.config, device=ctx.device)
    pinned = bool(getattr(loader, "pin_memory", False))
    stream = DataStream(loader, log=ctx.warn)
    first_s = timed(stream.__next__, torch.device("cpu"))  # worker start-up included
    batches = tokens = samples = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < ctx.options.seconds or batches < 2:
        n_samples, n_tokens = batch_size_of(next(stream))
        batches, tokens, samples = batches + 1, tokens + n_tokens, samples + n_samples
    del stream, loader  # stops loader workers, if any
    consumed = _consumption(ctx)
    return {
        "source": ctx.config.data.resolved_source,
        "num_workers": ctx.config.data.num_workers,
        "pin_memory": pinned,
        "batches": batches,
        "tokens_per_s": tokens / elapsed,
        "samples_per_s": samples / elapsed,
        "first_batch_s": first_s,
        "consumption_tokens_per_s": consumed,
        "headroom": tokens / elapsed / consumed,
        "data_wait_share": ctx.configured_row()["data_wait_share"],
    }


def _consumption(ctx: BenchContext) -> float:
    """Tokens/s the configured run consumes: compiled when compile is on and works."""
    compiled = ctx.doc["compile"]
    if compiled["enabled"] and not compiled["fell_back"]:
        return compiled["compiled_tokens_per_s"]
    return ctx.configured_row()["tokens_per_s"]

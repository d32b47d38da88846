"""Trainer overhead: Speedtronic's Trainer against a minimal hand-written PyTorch loop.

Usage::

    python benchmarks/engine/overhead.py  # smoke and 10m, the configs' precision
    python benchmarks/engine/overhead.py --config 10m --precision fp32 bf16 --rounds 7
    python benchmarks/engine/overhead.py --config 10m --flush on --clip one two

Both sides run in ONE process on the same device and threads and do the same work:

* model: the configured ``reference_transformer``, built twice from the same seed (checked
  equal before timing); each side owns its model, AdamW optimizer and LR scheduler, so no
  state is shared. The optimizer comes from ``speedtronic.optim.build.build_optimizer`` for both
  (same param groups, same fused/foreach kernel) and the schedule from ``build_scheduler``.
* data: each side reads its own ``speedtronic.data.build_dataloader(config)`` (the same
  ``SyntheticTokens`` dataset, micro-batch size, sampler order and worker settings); the
  Trainer wraps it in its ``DataStream``, the raw loop iterates it directly.
* precision, gradient accumulation and clipping: the Trainer's resolved autocast dtype, the
  config's accumulation count and max grad norm. ``--clip two`` makes the Trainer's side clip
  as it did before issue 40 (torch's norm pass and scale pass, then the step) instead of handing
  the scale to the fused AdamW step (``speedtronic.train.clip``); the raw loop always calls
  ``clip_grad_norm_``.

Each side first runs ``--warmup`` optimizer steps (not timed); then ``--rounds`` rounds of
``--steps`` timed optimizer steps alternate between the sides, in ABBA order (the order flips
every round) so slow drift of the machine hits both sides alike. Reported: the median over
rounds of each side's tokens/s and of the per-round ratio trainer/raw, plus the spread.

On a shared machine other processes steal cores: each round's CPU share (process CPU time /
(wall time * threads)) exposes that. "clean ratio" keeps only the rounds where both sides had
>= 97% of the CPU (threads that wait for each other lose ~10% already at 94%); "cpu-time
ratio" (raw CPU seconds / trainer CPU seconds, per round) hardly moves with contention when
run with ``--threads 1``. ``--check`` exits 1 when a ratio misses its target.

The raw loop, the ABBA alternation and the ratio statistics live in ``speedtronic.bench``,
which ``speedtronic bench`` uses for its "engine overhead" line: one implementation of both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from typing import Any

import torch

from speedtronic.bench import (
    IDLE_SHARE,
    RawLoop,
    Timings,
    alternate,
    build_raw,
    drop_checkpoints,
    ratio_stats,
)
from speedtronic.config import SpeedtronicConfig
from speedtronic.errors import SpeedtronicError
from speedtronic.runtime import Runtime, build_runtime, count_parameters

TARGETS = {"smoke": 0.90, "10m": 0.97}  # minimum trainer/raw throughput ratio
# (warm-up steps, timed steps per round) when --warmup / --steps are not given.
DEFAULT_STEPS = {"smoke": (10, 30), "10m": (2, 3)}
# ~10M parameters (9.8M): a small GQA decoder at seq_len 256, micro-batch 4 x 2 accumulation.
TEN_M = {
    "model": {"seq_len": 256, "n_layer": 6, "n_head": 6, "n_kv_head": 3, "d_model": 384},
    "data": {"micro_batch_size": 4, "target_batch_size": 8},
    "optimizer": {"lr": 1.0e-3},
}


def build_config(
    name: str, precision: str, total_steps: int, log_every: int, output_dir: str, flush: bool
) -> dict:
    """The packaged smoke config, or the ~10M variant of it, as a plain dict."""
    raw = SpeedtronicConfig.default().to_dict(redact=False)
    if name == "10m":
        for section, values in TEN_M.items():
            raw[section].update(values)
    # max_steps is the schedule horizon; nothing is written, output_dir is a scratch folder.
    raw["run"].update(name=f"overhead-{name}", max_steps=total_steps, output_dir=output_dir)
    raw["precision"].update(mode=precision, flush_denormal=flush)
    raw["logging"].update(every_steps=log_every, file=None, json_file=None, hooks=[])
    raw["checkpoint"]["interval"] = 0
    return raw


def measure(
    name: str, precision: str, flush: str, clip: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Build both sides for one config and precision, time them; returns the summary row."""
    warmup, steps = DEFAULT_STEPS[name]
    warmup, steps = args.warmup if args.warmup is not None else warmup, args.steps or steps
    with tempfile.TemporaryDirectory(prefix="speedtronic-overhead-") as scratch:
        total = warmup + args.rounds * steps
        runtime = build_runtime(
            build_config(name, precision, total, args.log_every, scratch, flush == "on"),
            console=False,
        )
        drop_checkpoints(runtime)
        runtime.trainer.clip.fold &= clip == "one"  # "two": the scale pass of its own
        raw = build_raw(runtime.config, runtime)
        timings = alternate(runtime, raw, warmup, steps, args.rounds, report=_stderr)
    row = summarize(name, runtime, raw, timings)
    fold = runtime.trainer.clip.fold
    return (
        row
        | {"flush_denormal": flush == "on", "clip_passes": 1 if fold else 2}
        | {
            "warmup_steps": warmup,
            "steps_per_round": steps,
        }
    )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def spread(values: list[float]) -> float:
    """(max - min) / median, in percent."""
    return 100.0 * (max(values) - min(values)) / statistics.median(values)


def summarize(name: str, runtime: Runtime, raw: RawLoop, timings: Timings) -> dict[str, Any]:
    config, stats = runtime.config, ratio_stats(timings)
    return {
        "config": name,
        "precision": runtime.precision.mode,
        "device": str(runtime.precision.device),
        "threads": timings.threads,
        "params": count_parameters(runtime.model),
        "optimizer": runtime.optimizer_kernel,
        "micro_batch_size": config.data.micro_batch_size,
        "accumulation_steps": config.accumulation_steps,
        "seq_len": config.seq_len,
        "tokens_per_step": config.tokens_per_step,
        "rounds": len(stats["round_ratios"]),
        "trainer_tokens_per_s": statistics.median(timings.rates("trainer")),
        "raw_tokens_per_s": statistics.median(timings.rates("raw")),
        "trainer_spread_pct": spread(timings.rates("trainer")),
        "raw_spread_pct": spread(timings.rates("raw")),
        "target": TARGETS[name],
        "ok": stats["ratio"] >= TARGETS[name],
        "trainer_skipped_steps": runtime.trainer.skipped_steps,
        "final_loss_trainer": runtime.trainer.last_loss,
        "final_loss_raw": raw.last_loss,
        **stats,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'config':<7}{'prec':<6}{'flush':<6}{'clip':<5}{'params':>11}{'tok/step':>9}"
        f"{'raw tok/s':>11}"
        f"{'trainer tok/s':>15}{'ratio':>7}{'ratio range':>15}{'spread raw/tr':>15}"
        f"{'clean ratio':>16}{'cpu-time ratio':>16}{'target':>8}  ok"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        clean = row["ratio_clean"]
        clean_text = f"{clean:.3f} ({row['clean_rounds']}/{row['rounds']})" if clean else "none"
        print(
            f"{row['config']:<7}{row['precision']:<6}"
            f"{'on' if row['flush_denormal'] else 'off':<6}"
            f"{'one' if row['clip_passes'] == 1 else 'two':<5}{row['params']:>11,}"
            f"{row['tokens_per_step']:>9,}{row['raw_tokens_per_s']:>11,.0f}"
            f"{row['trainer_tokens_per_s']:>15,.0f}{row['ratio']:>7.3f}"
            f"{row['ratio_min']:>9.3f}-{row['ratio_max']:.3f}"
            f"{row['raw_spread_pct']:>8.1f}%/{row['trainer_spread_pct']:.1f}%"
            f"{clean_text:>16}{row['ratio_cpu_time']:>16.3f}"
            f"{row['target']:>8.2f}  {'yes' if row['ok'] else 'NO'}"
        )
    if any(row["clean_rounds"] < row["rounds"] for row in rows):
        print(
            f"note: some rounds ran with under {IDLE_SHARE:.0%} of the CPU (another process was "
            "busy); 'clean ratio' is the median over the other rounds. Rerun on a quiet machine, "
            "or with --threads 1 and read the cpu-time ratio.",
            file=sys.stderr,
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", choices=sorted(TARGETS), default=["smoke", "10m"])
    parser.add_argument(
        "--precision",
        nargs="+",
        choices=["auto", "fp32", "bf16"],
        default=["auto"],
        help="one run per mode; auto = the config's resolved mode",
    )
    parser.add_argument(
        "--flush",
        nargs="+",
        choices=["on", "off"],
        default=["on", "off"],
        help="precision.flush_denormal of the Trainer's side (the raw loop keeps IEEE subnormals)",
    )
    parser.add_argument(
        "--clip",
        nargs="+",
        choices=["one", "two"],
        default=["one"],
        help="the Trainer's clipping: one pass (the scale folded into the fused AdamW step, "
        "where it can be) or two (torch's norm and scale passes, as before issue 40)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per side")
    parser.add_argument("--steps", type=int, help="timed optimizer steps per round")
    parser.add_argument("--warmup", type=int, help="untimed optimizer steps per side first")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--log-every", type=int, default=10, help="logging.every_steps")
    parser.add_argument("--check", action="store_true", help="exit 1 if a ratio misses target")
    args = parser.parse_args(argv)
    positive = (args.rounds, args.steps, args.threads, args.log_every)
    if any(n is not None and n < 1 for n in positive) or (args.warmup or 0) < 0:
        parser.error("--rounds, --steps, --threads and --log-every must be >= 1, --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        rows = [
            measure(name, mode, flush, clip, args)
            for name in args.config
            for mode in args.precision
            for flush in args.flush
            for clip in args.clip
        ]
    except SpeedtronicError as exc:  # e.g. the two models differ: say why, no traceback
        raise SystemExit(str(exc)) from None
    print_table(rows)
    print(json.dumps({"benchmark": "trainer_overhead", "results": rows}))
    return 1 if args.check and not all(row["ok"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

"""LoRA against full fine-tuning: a step's tokens/s and a checkpoint's bytes, same model.

Usage::

    python benchmarks/train/lora.py                   # ~10M model, 5 rounds of 3 steps
    python benchmarks/train/lora.py --model 10m 25m-wide --rounds 7 --threads 1 --check

Both sides fine-tune the same base (the ~10M model of ``benchmarks/engine/overhead.py``, or
``25m-wide``: two blocks of width 1024; trained one step and saved) with ``--init-from`` in
ONE process, same data, precision, threads and AdamW: "full" trains every weight, "lora" the
default ``model.lora`` (r 8, alpha 16, the seven attention and MLP projections), the base
frozen. Each side first runs ``--warmup`` optimizer steps (not timed); then ``--rounds``
rounds of ``--steps`` timed steps alternate in ABBA order (the order flips every round), so
the machine's drift hits both alike.
Reported: the median per-round ratio lora/full of tokens/s and of tokens per CPU second
(which contention moves least, with ``--threads 1``), each side's CPU share per round (process
CPU time / (wall x threads): well under 1 means another process had the cores) and the load
average before and after; then one checkpoint of each side: the weights file
(``model.safetensors``: the adapters alone for LoRA) and the whole checkpoint directory
(with the optimizer state), and their ratios full/lora. ``--check`` exits 1 unless LoRA's step
is faster and its checkpoint at least 20x smaller (issue 56).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from speedtronic.bench.probes import cpu_name
from speedtronic.bench.raw import drop_checkpoints, run_trainer
from speedtronic.config import SpeedtronicConfig
from speedtronic.runtime import Runtime, build_runtime, train_from_config

MODELS = {
    # The ~10M model of benchmarks/engine/overhead.py (9.8M): a small GQA decoder, seq 256.
    "10m": {
        "model": {"seq_len": 256, "n_layer": 6, "n_head": 6, "n_kv_head": 3, "d_model": 384},
        "data": {"micro_batch_size": 4, "target_batch_size": 8},
    },
    # Wider layers (~25M in 2 blocks of width 1024): where matmuls outweigh the adapters'
    # elementwise work, as in the models LoRA is used on (Llama widths are 2048-8192)
    "25m-wide": {
        "model": {"seq_len": 256, "n_layer": 2, "n_head": 16, "n_kv_head": 8, "d_model": 1024},
        "data": {"micro_batch_size": 4, "target_batch_size": 4},
    },
}
OPTIMIZER = {"name": "adamw", "lr": 1.0e-3}  # both sides: LoRA trains with AdamW
SIDES = ("full", "lora")
MIN_SIZE_RATIO = 20.0  # issue 56: a LoRA checkpoint at least 20x smaller


def config(model: str, name: str, scratch: Path, steps: int, base: Path | None, lora: bool) -> dict:
    raw = SpeedtronicConfig.default().to_dict(redact=False)
    raw["optimizer"] = dict(OPTIMIZER)  # the packaged config's Muon keys out
    for section, values in MODELS[model].items():
        raw[section].update(values)
    raw["run"].update(name=name, max_steps=steps, output_dir=str(scratch / name))
    raw["logging"].update(every_steps=10, file=None, json_file=None, hooks=[])
    raw["checkpoint"]["interval"] = 0
    if base is not None:
        raw["checkpoint"]["init_from"] = str(base)
    if lora:
        raw["model"]["lora"] = {}  # the defaults
    return raw


def build(model: str, scratch: Path, base: Path, steps: int) -> dict[str, Runtime]:
    sides = {}
    for side in SIDES:
        raw = config(model, side, scratch, steps, base, side == "lora")
        runtime = build_runtime(raw, console=False)
        drop_checkpoints(runtime)  # one save per side, measured apart from the steps
        sides[side] = runtime
    return sides


def alternate(sides: dict[str, Runtime], args: argparse.Namespace) -> dict[str, Any]:
    """Warm-up, then ABBA rounds; per side and round: tokens/s and CPU share."""
    for runtime in sides.values():
        run_trainer(runtime, args.warmup)
    threads = torch.get_num_threads()
    rates: dict[str, list[float]] = {s: [] for s in SIDES}
    shares: dict[str, list[float]] = {s: [] for s in SIDES}
    cpu_rates: dict[str, list[float]] = {s: [] for s in SIDES}  # tokens per CPU second
    for r in range(args.rounds):
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            runtime = sides[side]
            wall, cpu = time.perf_counter(), time.process_time()
            run_trainer(runtime, args.steps)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            tokens = args.steps * runtime.config.tokens_per_step
            rates[side].append(tokens / wall)
            shares[side].append(cpu / (wall * threads))
            cpu_rates[side].append(tokens / cpu)
        print(
            f"  round {r + 1}: "
            + "  ".join(f"{s} {rates[s][-1]:,.0f} tok/s (cpu {shares[s][-1]:.0%})" for s in SIDES),
            file=sys.stderr,
            flush=True,
        )
    ratios = [lo / fu for lo, fu in zip(rates["lora"], rates["full"], strict=True)]
    cpu_ratios = [lo / fu for lo, fu in zip(cpu_rates["lora"], cpu_rates["full"], strict=True)]
    return {
        "rates": rates,
        "shares": shares,
        "ratios": ratios,
        "cpu_ratios": cpu_ratios,
        "threads": threads,
    }


def checkpoint_bytes(runtime: Runtime) -> dict[str, int]:
    path = runtime.checkpoints.save(runtime.trainer)
    files = {p.name: p.stat().st_size for p in path.iterdir() if p.is_file()}
    return {"weights": files["model.safetensors"], "checkpoint": sum(files.values())}


def measure(model: str, args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="speedtronic-lora-bench-") as tmp:
        scratch = Path(tmp)
        train_from_config(config(model, "base", scratch, 1, None, False), console=False)
        steps = args.warmup + args.rounds * args.steps
        sides = build(model, scratch, scratch / "base", steps)
        timed = alternate(sides, args)
        sizes = {side: checkpoint_bytes(runtime) for side, runtime in sides.items()}
    lora_model = sides["lora"].model
    trainable = sum(p.numel() for p in lora_model.parameters() if p.requires_grad)
    full, lora = sizes["full"], sizes["lora"]
    ratio = statistics.median(timed["ratios"])
    row = {
        "model": model,
        "cpu": cpu_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "threads": timed["threads"],
        "precision": sides["full"].precision.mode,
        "params": sum(p.numel() for p in sides["full"].model.parameters()),
        "lora_trainable": trainable,
        "tokens_per_step": sides["full"].config.tokens_per_step,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "full_tokens_per_s": statistics.median(timed["rates"]["full"]),
        "lora_tokens_per_s": statistics.median(timed["rates"]["lora"]),
        "speed_ratio": ratio,
        "speed_ratio_min": min(timed["ratios"]),
        "speed_ratio_max": max(timed["ratios"]),
        # CPU seconds per token, full/lora: what contention moves least (with --threads 1)
        "cpu_time_ratio": statistics.median(timed["cpu_ratios"]),
        "cpu_share_full": [round(s, 3) for s in timed["shares"]["full"]],
        "cpu_share_lora": [round(s, 3) for s in timed["shares"]["lora"]],
        "load_before": [round(v, 2) for v in load_before],
        "load_after": [round(v, 2) for v in os.getloadavg()],
        "full_weights_bytes": full["weights"],
        "lora_weights_bytes": lora["weights"],
        "full_checkpoint_bytes": full["checkpoint"],
        "lora_checkpoint_bytes": lora["checkpoint"],
        "weights_size_ratio": full["weights"] / lora["weights"],
        "checkpoint_size_ratio": full["checkpoint"] / lora["checkpoint"],
    }
    row["ok"] = ratio > 1.0 and row["checkpoint_size_ratio"] >= MIN_SIZE_RATIO
    return row


def print_table(row: dict[str, Any]) -> None:
    print(
        f"{row['cpu']} ({row['cpu_capability']}), {row['cores']} cores, {row['threads']} "
        f"threads, {row['precision']}; load {row['load_before']} -> {row['load_after']}"
    )
    print(
        f"model {row['model']}: {row['params']:,} params; LoRA trains {row['lora_trainable']:,} "
        f"({row['lora_trainable'] / row['params']:.2%}); {row['tokens_per_step']:,} tokens/step"
    )
    head = f"{'side':<6}{'tok/s':>10}{'cpu share (rounds)':>34}{'weights':>12}{'checkpoint':>13}"
    print(head)
    print("-" * len(head))
    for side in SIDES:
        shares = " ".join(f"{s:.0%}" for s in row[f"cpu_share_{side}"])
        print(
            f"{side:<6}{row[f'{side}_tokens_per_s']:>10,.0f}{shares:>34}"
            f"{row[f'{side}_weights_bytes']:>12,}{row[f'{side}_checkpoint_bytes']:>13,}"
        )
    print(
        f"lora/full tokens/s {row['speed_ratio']:.2f}x (rounds {row['speed_ratio_min']:.2f}-"
        f"{row['speed_ratio_max']:.2f}), per CPU second {row['cpu_time_ratio']:.2f}x; "
        f"full/lora bytes: weights {row['weights_size_ratio']:.0f}x,"
        f" checkpoint {row['checkpoint_size_ratio']:.0f}x; ok: {'yes' if row['ok'] else 'NO'}"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", choices=list(MODELS), default=["10m"])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per side")
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps per round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps first")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)
    if min(args.rounds, args.steps) < 1 or args.warmup < 0 or (args.threads or 1) < 1:
        parser.error("--rounds, --steps and --threads must be >= 1, --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rows = [measure(model, args) for model in args.model]
    for row in rows:
        print_table(row)
    print(json.dumps({"benchmark": "lora_vs_full", "results": rows}))
    return 1 if args.check and not all(row["ok"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

"""DDP scaling: global tokens/s with 1 rank and with N ranks, and the scaling efficiency.

Usage::

    python benchmarks/engine/ddp_scaling.py  # CPU: 1 and 2 ranks, tiny model
    python benchmarks/engine/ddp_scaling.py --config configs/gpt2_small.yaml --ranks 1 8 --steps 60
    python benchmarks/engine/ddp_scaling.py --eval-batches 16           # also time the evaluation

Each size runs ``speedtronic train`` under ``torchrun --standalone --nproc-per-node N`` with
the same per-rank work (weak scaling: ``data.target_batch_size`` = micro batch x N x the
config's accumulation), ``--log-format json``, and reads rank 0's ``train_step`` events.
tokens/s is the median of the logged windows after ``--warmup`` steps (compile and the first
buckets are excluded). Efficiency at N = tokens/s(N) / (N x tokens/s(1)); the target on GPUs
is >= 90% per GPU at 8 GPUs for configs/gpt2_small.yaml. On CPU the ranks share the
machine's cores, so efficiency there mostly measures how many cores there are, not DDP: with
2 cores, 2 ranks at 1 thread each is the best case. Prints a table and one JSON line.

``--eval-batches N`` also evaluates N held-out batches every few steps (the built-in model
then trains on a generated text file, 10% held out; a ``--config`` must have its own held-out
set) and reports the median ``eval_s`` of each size and the speed-up against 1 rank: the
ranks share the batches, so N ranks should take about 1/N of the time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout, not another installed copy
TINY = {
    "run": {"name": "ddp_scaling", "seed": 0, "device": "cpu"},
    "model": {
        "name": "reference_transformer",
        "vocab_size": 256,
        "seq_len": 128,
        "n_layer": 4,
        "n_head": 4,
        "d_model": 256,
    },
    "data": {"micro_batch_size": 8, "target_batch_size": 8},
    "checkpoint": {"interval": 0},
}


def run_size(
    config: str, ranks: int, steps: int, warmup: int, workdir: Path, eval_batches: int
) -> dict:
    """Train ``steps`` steps on ``ranks`` processes; tokens/s (and eval_s) from rank 0's
    events."""
    from speedtronic.config import SpeedtronicConfig

    cfg = SpeedtronicConfig.load(config)
    accumulation = cfg.accumulation_for(1)
    target = cfg.data.micro_batch_size * accumulation * ranks
    every = max(1, (steps - warmup) // 5)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={ranks}", "-m", "speedtronic", "train", "-c", config]
    command += ["--max-steps", str(steps), "--output-dir", str(workdir / f"ranks{ranks}")]
    command += [
        "--set",
        f"data.target_batch_size={target}",
        "--set",
        f"logging.every_steps={every}",
    ]
    command += ["--set", "checkpoint.interval=0", "--log-format", "json"]
    if eval_batches:
        command += ["--set", f"data.eval_batches={eval_batches}"]
        command += ["--set", f"data.eval_every={every}"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-5:]
        raise SystemExit(f"{ranks} rank(s) failed (exit {done.returncode}): " + " | ".join(tail))
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    windows = [
        e["tokens_per_s"] for e in events if e["event"] == "train_step" and e["step"] > warmup
    ]
    if not windows:
        raise SystemExit(f"{ranks} rank(s): no train_step after warmup; raise --steps")
    result = {"ranks": ranks, "tokens_per_s": statistics.median(windows), "windows": len(windows)}
    evals = [e["eval_s"] for e in events if e["event"] == "eval"]
    if eval_batches and not evals:
        raise SystemExit(f"{ranks} rank(s): no eval events; the config needs a held-out set")
    result["eval_s"] = statistics.median(evals) if evals else None
    return result


def with_text(config: dict, workdir: Path) -> dict:
    """``config`` training on a generated text file with 10% held out (for --eval-batches)."""
    text = workdir / "corpus.txt"
    lines = (f"line {i}: the quick brown fox jumps {i % 97}\n" for i in range(60000))
    text.write_text("".join(lines))
    data = {**config["data"], "text_path": str(text), "eval_fraction": 0.1}
    return {**config, "data": data}


def print_table(results: list[dict]) -> None:
    """The table; adds each size's efficiency (and eval speed-up) to its result."""
    base = next((r for r in results if r["ranks"] == 1), None)
    header = f"{'ranks':>5}  {'tokens/s':>12}  {'per rank':>12}  {'efficiency':>10}"
    print(header + (f"  {'eval s':>8}  {'eval speed-up':>13}" if results[0]["eval_s"] else ""))
    for r in results:
        eff = r["tokens_per_s"] / (r["ranks"] * base["tokens_per_s"]) if base else None
        r["efficiency"] = eff
        shown = f"{eff:.1%}" if eff is not None else "-"
        per_rank = r["tokens_per_s"] / r["ranks"]
        line = f"{r['ranks']:>5}  {r['tokens_per_s']:>12,.0f}  {per_rank:>12,.0f}  {shown:>10}"
        if r["eval_s"]:
            r["eval_speedup"] = base["eval_s"] / r["eval_s"] if base else None
            up = f"{r['eval_speedup']:.2f}x" if base else "-"
            line += f"  {r['eval_s']:>8.3f}  {up:>13}"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="config file; default: a small CPU model")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--check", type=float, default=None, help="exit 1 below this efficiency")
    parser.add_argument("--eval-batches", type=int, default=0, help="also time evaluation")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = args.config
        if config is None:
            tiny = with_text(TINY, Path(tmp)) if args.eval_batches else TINY
            config = str(Path(tmp) / "tiny.json")
            Path(config).write_text(json.dumps(tiny))
        each = (args.steps, args.warmup, Path(tmp), args.eval_batches)
        results = [run_size(config, n, *each) for n in args.ranks]
    print_table(results)
    print(json.dumps({"benchmark": "ddp_scaling", "cpu_count": os.cpu_count(), "sizes": results}))
    worst = min((r["efficiency"] for r in results if r["efficiency"] is not None), default=None)
    if args.check is not None and worst is not None and worst < args.check:
        sys.exit(1)


if __name__ == "__main__":
    main()

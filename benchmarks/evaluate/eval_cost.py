"""What scoring named held-out sets (``eval.sets``) costs a training run, as a share of its
training time in the same run.

Usage::

    python benchmarks/evaluate/eval_cost.py                      # smoke model, ~1-2 min
    python benchmarks/evaluate/eval_cost.py --model 10m --steps 60 --every 30

The run: the smoke config's model (or the ~10M one) trained on byte-level text (Python's
standard-library sources, the first 2 MB for training, two other files as the held-out sets)
with ``eval.sets`` of two sets at ``eval.max_tokens`` each, scored every ``--every`` steps and at
the end. From its own JSONL events: the seconds every ``eval_set`` took (``eval_s``) against
the rest of the run's training time (``run_end.elapsed_s`` minus them): the share. Then the
same config without ``eval.sets`` is run, alternated with the first ``--rounds`` times (ABAB...),
so the wall-clock difference checks that ``eval_s`` is the whole cost (nothing hidden outside
the timed part). Also reported: one evaluation's cost in training steps (its seconds over the
median step's), which says the cadence at which a share holds: share = cost_steps / every.

Target: <= 5% of training time at ``eval.every`` >= 100 with the defaults (two sets of 8192
tokens); ``--check`` exits 1 when the measured share misses it at the chosen cadence.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

TARGET = 0.05
SIZES = {
    "smoke": {},
    "10m": {"seq_len": 256, "n_layer": 6, "n_head": 6, "n_kv_head": 3, "d_model": 384},
}


def write_texts(scratch: Path) -> tuple[Path, list[Path]]:
    """2 MB of stdlib sources to train on, and two held-out files (other sources)."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    body = "".join(p.read_text(encoding="utf-8", errors="replace") for p in files[:-40])
    train = scratch / "train.txt"
    train.write_text(body[: 2 << 20], encoding="utf-8")
    held = []
    for index, chunk in enumerate((files[-40:-20], files[-20:])):
        path = scratch / f"held_{index}.txt"
        path.write_text("".join(p.read_text(encoding="utf-8", errors="replace") for p in chunk))
        held.append(path)
    return train, held


def config(args: argparse.Namespace, scratch: Path, name: str, sets: list[str]) -> dict:
    from speedtronic.config import SpeedtronicConfig

    raw = SpeedtronicConfig.default().to_dict(redact=False)
    raw["model"].update(SIZES[args.model])
    raw["run"].update(max_steps=args.steps, device=args.device, output_dir=str(scratch / name))
    raw["data"].update(text_path=str(scratch / "train.txt"))
    raw["logging"].update(json_file=str(scratch / f"{name}.jsonl"), every_steps=1)
    if sets:
        raw["eval"] = {"every": args.every, "sets": sets, "max_tokens": args.max_tokens}
    return raw


def run_once(raw: dict) -> dict[str, Any]:
    from speedtronic.runtime import train_from_config

    started = time.perf_counter()
    train_from_config(raw, console=False)
    wall = time.perf_counter() - started
    records = [json.loads(x) for x in Path(raw["logging"]["json_file"]).read_text().splitlines()]
    end = next(r for r in records if r["event"] == "run_end")
    evals = [r["eval_s"] for r in records if r["event"] == "eval_set"]
    steps = [r for r in records if r["event"] == "train_step"]
    step_s = statistics.median(1 / r["steps_per_s"] for r in steps[1:] if r["steps_per_s"])
    return {"wall": wall, "elapsed": end["elapsed_s"], "eval_s": sum(evals),
            "evaluations": len(evals), "step_s": step_s}  # fmt: skip


def measure(args: argparse.Namespace) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="eval_cost_"))
    _, held = write_texts(scratch)
    sets = [f"a={held[0]}", f"b={held[1]}"]
    with_sets, without = [], []
    for index in range(args.rounds):
        with_sets.append(run_once(config(args, scratch, f"sets{index}", sets)))
        without.append(run_once(config(args, scratch, f"plain{index}", [])))
        print(f"round {index}: with sets {with_sets[-1]}, without {without[-1]}", file=sys.stderr)
    share = [r["eval_s"] / (r["elapsed"] - r["eval_s"]) for r in with_sets]
    per_eval = [r["eval_s"] / (r["evaluations"] / 2) for r in with_sets]  # two sets each
    cost_steps = [p / r["step_s"] for p, r in zip(per_eval, with_sets, strict=True)]
    wall_ratio = [a["wall"] / b["wall"] for a, b in zip(with_sets, without, strict=True)]
    return {
        "model": args.model, "steps": args.steps, "every": args.every,
        "max_tokens": args.max_tokens, "sets": 2, "rounds": args.rounds,
        "share": statistics.median(share), "share_range": [min(share), max(share)],
        "eval_cost_steps": statistics.median(cost_steps),
        "wall_with_over_without": statistics.median(wall_ratio),
        "load_1m": os.getloadavg()[0],
    }  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(SIZES), default="smoke")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--check", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = measure(args)
    print("| model | steps | every | sets x max_tokens | eval share of training (range) | "
          "one evaluation, in steps | wall with / without |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    low, high = result["share_range"]
    print(
        f"| {args.model} | {args.steps} | {args.every} | 2 x {args.max_tokens} | "
        f"{result['share']:.1%} ({low:.1%}-{high:.1%}) | {result['eval_cost_steps']:.2f} | "
        f"{result['wall_with_over_without']:.3f} |"
    )
    print(json.dumps(result))
    return 1 if args.check and result["share"] > TARGET else 0


if __name__ == "__main__":
    sys.exit(main())

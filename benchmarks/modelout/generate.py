"""Generation speed: ``speedtronic generate``'s decoding against transformers' ``generate``.

Usage::

    python benchmarks/modelout/generate.py                          # smoke and 10m, CPU, batch 1
    python benchmarks/modelout/generate.py --model 10m --rounds 9 --threads 1 --check

Both arms run in ONE process on the same device and threads, on the SAME run: a run of the
chosen size is trained for a few steps (decoding speed does not depend on the weights' values),
exported with ``speedtronic.modelout.export`` (fp32), and loaded twice: as the run's own
``ReferenceTransformer`` (what ``speedtronic generate RUN`` decodes with: ``Decoder`` +
``generate``, its KV cache, the run's precision) and as transformers'
``AutoModelForCausalLM.from_pretrained(export)`` (``model.generate``, its own cache). The same
prompt ids (the prompt encoded with the run's tokenizer), batch 1, greedy on both sides so they
do the same work: every round checks both produced the same tokens. ``--new-tokens`` tokens
each time, ``min_new_tokens`` on transformers' side too, prompt + new within the context.

One untimed generation per arm first; then ``--rounds`` rounds alternate the arms in ABBA order
(flipped every round) so drift of a shared machine hits both alike. tokens/s counts new tokens
over the wall time of the whole call (prompt forward included) on both sides. Reported: each
arm's median tokens/s, the median and range of the per-round ratio speedtronic/transformers,
each round's CPU share (process CPU time / (wall x threads): another process on the cores shows
up there), and the load average before and after. Target: ratio >= 1.0 on CPU at batch 1;
``--check`` exits 1 when a size misses it.
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

TARGET = 1.0
SIZES = {  # model params over the smoke config's; (prompt text repeats, new tokens)
    "smoke": ({}, 1, 32),
    "10m": ({"seq_len": 256, "n_layer": 6, "n_head": 6, "n_kv_head": 3, "d_model": 384}, 3, 160),
}
PROMPT = "It was the best of times, "


def prepare(size: str, scratch: Path) -> tuple[Any, Any, list[int], int]:
    """Train the run, export it, load both sides: (run model, transformers model, ids, new)."""
    from speedtronic.config import SpeedtronicConfig
    from speedtronic.modelout.export import export_run
    from speedtronic.modelout.source import open_run
    from speedtronic.modelout.verify import load_transformers
    from speedtronic.runtime import train_from_config

    params, repeats, new = SIZES[size]
    raw = SpeedtronicConfig.default().to_dict(redact=False)
    raw["model"].update(params)
    raw["run"].update(max_steps=2, device="cpu", output_dir=str(scratch / "run"))
    raw["data"].update(micro_batch_size=2, target_batch_size=2)
    raw["logging"].update(every_steps=100)
    train_from_config(raw, console=False)
    run = open_run(scratch / "run")
    export_run(run, scratch / "hf", "fp32")
    transformers = load_transformers()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(scratch / "hf", dtype=torch.float32)
    ids = run.tokenizer(PROMPT * repeats)
    if len(ids) + new > run.model.config.seq_len:
        raise SystemExit(f"{size}: prompt + new tokens exceed the context")
    return run, theirs.eval(), ids, new


def ours_once(run: Any, ids: list[int], new: int) -> list[int]:
    from speedtronic.modelout.generate import Decoder, Sampling, generate
    from speedtronic.train.precision import resolve_precision

    precision = resolve_precision(run.precision_mode, torch.device("cpu"), print)
    decoder = Decoder(run.model, run.model.config.seq_len, precision)
    greedy = Sampling(max_new_tokens=new, temperature=0.0)
    return generate(decoder, ids, greedy, torch.Generator()).ids


def theirs_once(model: Any, ids: list[int], new: int) -> list[int]:
    prompt = torch.tensor([ids])
    out = model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    return out[0, len(ids) :].tolist()


def timed(fn, *args) -> tuple[list[int], float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    tokens = fn(*args)
    wall = time.perf_counter() - wall
    return tokens, wall, (time.process_time() - cpu) / (wall * torch.get_num_threads())


def measure(size: str, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="speedtronic-generate-bench-") as scratch:
        load_before = os.getloadavg()
        run, theirs, ids, new = prepare(size, Path(scratch))
        arms = {"speedtronic": lambda: ours_once(run, ids, new), "transformers": None}
        arms["transformers"] = lambda: theirs_once(theirs, ids, new)
        expected = arms["speedtronic"]()
        if arms["transformers"]() != expected:
            raise SystemExit(f"{size}: the two arms' greedy tokens differ: not the same work")
        rates: dict[str, list[float]] = {"speedtronic": [], "transformers": []}
        shares: list[tuple[float, float]] = []
        for r in range(rounds):
            order = ["speedtronic", "transformers"][:: 1 if r % 2 == 0 else -1]
            share = {}
            for arm in order:
                tokens, wall, share[arm] = timed(arms[arm])
                assert tokens == expected, f"{arm} produced other tokens in round {r}"
                rates[arm].append(new / wall)
            shares.append((share["speedtronic"], share["transformers"]))
            ratio = rates["speedtronic"][-1] / rates["transformers"][-1]
            print(f"{size} round {r + 1}/{rounds}: ratio {ratio:.3f}", file=sys.stderr)
        ratios = [a / b for a, b in zip(rates["speedtronic"], rates["transformers"], strict=True)]
        import transformers

        return {
            "model": size,
            "params": run.model.num_parameters(),
            "seq_len": run.model.config.seq_len,
            "prompt_tokens": len(ids),
            "new_tokens": new,
            "threads": torch.get_num_threads(),
            "rounds": rounds,
            "speedtronic_tokens_per_s": statistics.median(rates["speedtronic"]),
            "transformers_tokens_per_s": statistics.median(rates["transformers"]),
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "cpu_share_min": min(min(pair) for pair in shares),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "target": TARGET,
            "ok": statistics.median(ratios) >= TARGET,
        }


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'model':<7}{'params':>11}{'prompt+new':>12}{'speedtronic tok/s':>19}"
        f"{'transformers tok/s':>20}{'ratio':>7}{'range':>14}{'min cpu':>9}{'load 1m':>14}  ok"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        print(
            f"{row['model']:<7}{row['params']:>11,}"
            f"{row['prompt_tokens']:>6}+{row['new_tokens']:<5}"
            f"{row['speedtronic_tokens_per_s']:>19,.1f}{row['transformers_tokens_per_s']:>20,.1f}"
            f"{row['ratio']:>7.2f}{row['ratio_min']:>8.2f}-{row['ratio_max']:.2f}"
            f"{row['cpu_share_min']:>8.0%}{row['load_before'][0]:>7.2f}->{row['load_after'][0]:.2f}"
            f"  {'yes' if row['ok'] else 'NO'}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", choices=sorted(SIZES), default=["smoke", "10m"])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per arm")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a ratio misses 1.0")
    args = parser.parse_args(argv)
    if args.rounds < 1 or (args.threads is not None and args.threads < 1):
        parser.error("--rounds and --threads must be >= 1")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rows = [measure(size, args.rounds) for size in args.model]
    print_table(rows)
    print(json.dumps({"benchmark": "generate", "results": rows}))
    return 1 if args.check and not all(row["ok"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

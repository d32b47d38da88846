"""One Muon step on the reference decoder's hidden matrices: ours against torch.optim.Muon.

Usage::

    python benchmarks/optim/muon_step.py [--sizes small,large,gpt2] [--device cpu] [--repeats 15]

For each model size, the hidden matrices of ``reference_transformer`` (``hidden_matrices()``)
with random gradients, and one ``step()`` of: ``torch.optim.Muon`` (bf16 Newton-Schulz, one
matrix at a time, as torch 2.13 ships it), ``speedtronic.optim.muon.Muon`` with same-shape matrices
stacked in bf16 (the same math: a test holds it to torch's within bf16 rounding), and the same
in fp32 (what a CPU that emulates bf16 runs). Also fused AdamW over the same matrices, the
floor. Timed in alternated rounds after a warm-up, one thread, in thread CPU time on a CPU
(a shared machine's wall-clock is noise) and synchronised wall-clock on a GPU; medians.
Prints a table and one JSON line (``{"benchmark": "muon_step", ...}``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from speedtronic.optim.muon import Muon  # noqa: E402
from speedtronic.registry import build_model  # noqa: E402

SIZES = {
    "small": dict(d_model=128, n_layer=2, n_head=4, n_kv_head=2),
    "large": dict(d_model=256, n_layer=6, n_head=4, n_kv_head=2),
    "gpt2": dict(d_model=768, n_layer=12, n_head=12),
}


def optimizers(params: list[torch.nn.Parameter]) -> dict[str, torch.optim.Optimizer]:
    copies = {}
    for name in ("torch.optim.Muon", "stacked bf16", "stacked fp32", "fused AdamW"):
        copies[name] = [torch.nn.Parameter(p.detach().clone()) for p in params]
        for p in copies[name]:
            p.grad = torch.randn_like(p)
    return {
        "torch.optim.Muon": torch.optim.Muon(copies["torch.optim.Muon"], lr=0.02),
        "stacked bf16": Muon(copies["stacked bf16"], lr=0.02, ns_dtype=torch.bfloat16),
        "stacked fp32": Muon(copies["stacked fp32"], lr=0.02, ns_dtype=torch.float32),
        "fused AdamW": torch.optim.AdamW(copies["fused AdamW"], lr=1e-3, fused=True),
    }


def measure(size: str, device: torch.device, repeats: int) -> dict[str, float]:
    with torch.device(device):
        model = build_model("reference_transformer", {"vocab_size": 256, **SIZES[size]})
    opts = optimizers(list(model.hidden_matrices()))
    clock = time.thread_time if device.type == "cpu" else time.perf_counter
    times: dict[str, list[float]] = {name: [] for name in opts}
    for r in range(repeats + 1):
        names = list(opts) if r % 2 == 0 else list(opts)[::-1]
        for name in names:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = clock()
            opts[name].step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if r:  # round 0 warms up (kernel generation, allocations)
                times[name].append(clock() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="small,large")
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = {size: measure(size, device, args.repeats) for size in args.sizes.split(",")}
    print(f"{'size':<8}" + "".join(f"{name:>20}" for name in next(iter(rows.values()))))
    for size, row in rows.items():
        base = row["torch.optim.Muon"]
        cells = "".join(f"{1000 * v:>11.2f} ms {v / base:>4.2f}x" for v in row.values())
        print(f"{size:<8}{cells}")
    print(json.dumps({"benchmark": "muon_step", "device": str(device), "threads": args.threads,
                      "torch": torch.__version__, "seconds": rows}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

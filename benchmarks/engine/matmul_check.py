"""Plain ``torch.mm`` timing, independent of Speedtronic: the cross-check of ``bench``'s peaks.

Usage::

    python benchmarks/engine/matmul_check.py                          # fp32 and bf16, this device
    speedtronic bench --format json > bench.json
    python benchmarks/engine/matmul_check.py --compare bench.json  # same sizes; exit 1 if > 15% off

Imports only torch, so nothing of ``speedtronic.bench`` is reused: a bug there cannot hide
here. Per dtype: square ``--size`` matrices (default: 2048 on CPU, 8192 on CUDA, or bench's
size with ``--compare``), untimed warm-up products for ``--warmup`` seconds (at least three;
they also estimate the time of one: the first heavy seconds of a fresh process run slow), then
``--repeats`` timed blocks of back-to-back ``torch.mm(a, b)`` filling ``--seconds``; the
device is synchronised before every clock read. Reported: the best block (the peak, what
bench reports as ``tflops``) and the median block, in TFLOP/s (2 * size^3 per product). One
table and one JSON line; ``--compare`` adds bench's figure and the relative difference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}
DTYPES["fp16"] = torch.float16


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def block(a: torch.Tensor, b: torch.Tensor, n: int, device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    for _ in range(n):
        torch.mm(a, b)
    sync(device)
    return time.perf_counter() - start


def measure(
    name: str, size: int, device: torch.device, seconds: float, repeats: int, warmup: float
) -> dict:
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
    a = torch.randn(size, size, device=device).to(DTYPES[name])
    b = torch.randn(size, size, device=device).to(DTYPES[name])
    done, spent = 3, block(a, b, 3, device)
    while spent < warmup:
        spent += block(a, b, done, device)
        done *= 2
    per_product = block(a, b, 3, device) / 3
    n = max(1, round(seconds / repeats / per_product))
    times = [block(a, b, n, device) for _ in range(repeats)]
    flops = 2.0 * size**3 * n
    return {
        "dtype": name,
        "size": size,
        "products_per_block": n,
        "tflops": flops / min(times) / 1e12,
        "tflops_median": flops / statistics.median(times) / 1e12,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--size", type=int, help="matrix side (default: by device, or bench's)")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: bench's/auto)")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per dtype")
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks per dtype")
    parser.add_argument("--warmup", type=float, default=1.0, help="untimed seconds per dtype")
    parser.add_argument("--compare", help="a `speedtronic bench --format json` document")
    parser.add_argument("--tolerance", type=float, default=0.15, help="max relative difference")
    args = parser.parse_args(argv)
    bench = json.load(open(args.compare, encoding="utf-8")) if args.compare else None
    device = torch.device(args.device or _bench_device(bench) or _auto_device())
    rows = []
    for name in args.dtypes:
        theirs = (bench or {}).get("peaks", {}).get("matmul", {}).get(name)
        if bench is not None and not theirs:
            print(f"bench measured no {name} peak; skipped", file=sys.stderr)
            continue
        size = args.size or (theirs or {}).get("size") or (8192 if device.type == "cuda" else 2048)
        row = measure(name, size, device, args.seconds, args.repeats, args.warmup)
        if theirs:
            row["bench_tflops"] = theirs["tflops"]
            row["difference"] = theirs["tflops"] / row["tflops"] - 1
        rows.append(row)
    report(rows, device, args.tolerance)
    return 1 if any(abs(r.get("difference", 0.0)) > args.tolerance for r in rows) else 0


def _bench_device(bench: dict | None) -> str | None:
    if not bench:
        return None
    device = bench["device"]
    index = device.get("index")
    return device["backend"] + (f":{index}" if index is not None else "")


def _auto_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def report(rows: list[dict], device: torch.device, tolerance: float) -> None:
    print(
        f"plain torch.mm on {device} ({torch.get_num_threads()} threads, torch {torch.__version__})"
    )
    print(f"{'dtype':<6}{'size':>6}{'TFLOP/s best':>14}{'median':>9}{'bench':>9}{'diff':>8}")
    for r in rows:
        bench = f"{r['bench_tflops']:>9.3g}" if "bench_tflops" in r else f"{'-':>9}"
        diff = f"{r['difference']:>+8.1%}" if "difference" in r else f"{'-':>8}"
        print(
            f"{r['dtype']:<6}{r['size']:>6}{r['tflops']:>14.3g}{r['tflops_median']:>9.3g}"
            f"{bench}{diff}"
        )
    if any("difference" in r for r in rows):
        ok = all(abs(r["difference"]) <= tolerance for r in rows if "difference" in r)
        print(f"bench agrees within {tolerance:.0%}: {'yes' if ok else 'NO'}")
    print(json.dumps({"benchmark": "matmul_check", "device": str(device), "results": rows}))


if __name__ == "__main__":
    sys.exit(main())

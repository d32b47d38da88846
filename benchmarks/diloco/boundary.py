"""DumbDiLoCo boundary cost: how long the training thread stalls at a sync, against the loop.

Usage::

    python benchmarks/diloco/boundary.py                      # 10M config, H=50, 3 inner loops
    python benchmarks/diloco/boundary.py --device cuda --inner-loops 5 --check

One process trains the ~10M reference config (``benchmarks/engine/overhead.py``'s) as a DumbDiLoCo
master that also trains, on a shared directory, with ``min_deltas: 1``: every boundary
uploads a delta, the master thread turns it into a new global, and the next boundary installs
it, so the measured stalls include the snapshot, the pseudo-gradient and the install. The
stall is what the ``diloco_boundary`` event reports (measured inside the training thread);
the inner loop's time is the wall time between consecutive boundaries, in the same run. The
first boundary is warm-up and not counted. Target: median stall <= 5% of an inner loop.
Also reported: the bytes of the run's real delta encoded as fp32, bf16 and int8 (target: bf16
is half of fp32). Prints a table and one JSON line; ``--check`` exits 1 on a missed target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from speedtronic.config import SpeedtronicConfig  # noqa: E402
from speedtronic.distributed.codec import encode_delta  # noqa: E402
from speedtronic.distributed.protocol import DeltaHeader  # noqa: E402
from speedtronic.distributed.worker.plugin import WorkerPlugin  # noqa: E402
from speedtronic.runtime import build_runtime  # noqa: E402

STALL_SHARE_TARGET = 0.05
TEN_M = {
    "model": {"seq_len": 256, "n_layer": 6, "n_head": 6, "n_kv_head": 3, "d_model": 384},
    "data": {"micro_batch_size": 4, "target_batch_size": 8},
    "optimizer": {"lr": 1.0e-3},
}


def build_config(args: argparse.Namespace, scratch: str) -> dict:
    raw = SpeedtronicConfig.default().to_dict(redact=False)
    for section, values in TEN_M.items():
        raw[section].update(values)
    steps = args.inner_steps * (args.inner_loops + 1)
    raw["run"].update(name="diloco-boundary", max_steps=steps, output_dir=scratch)
    raw["run"]["device"] = args.device
    raw["precision"]["mode"] = args.precision
    raw["logging"].update(every_steps=10**6, file=None, json_file=None, hooks=[])
    raw["checkpoint"]["interval"] = 0
    raw["distributed"].update(
        enabled=True,
        role="master",
        node_id="bench",
        repo_id=f"{scratch}/repo",
        inner_steps=args.inner_steps,
        poll_interval=0.2,
        min_deltas=1,
        max_wait_s=0.0,
        delta_dtype="bf16",
    )
    return raw


class Boundaries:
    """A hook keeping the wall time and payload of every boundary event."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, dict]] = []

    def on_event(self, event: str, payload: dict) -> None:
        if event == "diloco_boundary":
            self.rows.append((time.perf_counter(), payload))


def measure(args: argparse.Namespace) -> dict:
    boundaries = Boundaries()
    with tempfile.TemporaryDirectory(prefix="speedtronic-diloco-boundary-") as scratch:
        runtime = build_runtime(build_config(args, scratch), hooks=[boundaries], console=False)
        result = runtime.trainer.fit()
        worker = next(p for p in runtime.trainer.plugins if isinstance(p, WorkerPlugin))
        sizes = encoded_sizes(worker)
    rows = boundaries.rows[1:]  # the first boundary includes warm-up steps: not counted
    loops = [b[0] - a[0] for a, b in zip(boundaries.rows, boundaries.rows[1:], strict=False)]
    stalls = [payload["stall_s"] for _, payload in rows]
    installs = sum(1 for _, payload in rows if payload["installed"] is not None)
    loop_s, stall_s = statistics.median(loops), statistics.median(stalls)
    return {
        "device": str(runtime.precision.device),
        "precision": runtime.precision.mode,
        "inner_steps": args.inner_steps,
        "boundaries_timed": len(rows),
        "globals_installed": installs,
        "inner_loop_s": loop_s,
        "stall_s": stall_s,
        "stall_max_s": max(stalls),
        "stall_share": stall_s / loop_s,
        "delta_bytes": sizes,
        "bf16_over_fp32": sizes["bf16"] / sizes["fp32"],
        "steps": result.steps,
    }


def encoded_sizes(worker: WorkerPlugin) -> dict[str, int]:
    """The bytes of one real pseudo-gradient of this run in every encoding."""
    delta = {k: (worker.base[k] - p.detach().float()).cpu() for k, p in worker.params.items()}
    sizes = {}
    for encoding in ("fp32", "bf16", "int8"):
        header = DeltaHeader("bench", 1, 0, 1, 1, encoding, "now")
        sizes[encoding] = len(encode_delta(delta, header))
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--inner-steps", type=int, default=50)
    parser.add_argument("--inner-loops", type=int, default=3, help="timed inner loops")
    parser.add_argument("--check", action="store_true", help="exit 1 on a missed target")
    args = parser.parse_args()
    row = measure(args)
    print(f"device {row['device']} {row['precision']}, H={row['inner_steps']}:")
    print(f"  inner loop        {row['inner_loop_s']:.3f} s (median)")
    print(
        f"  boundary stall    {row['stall_s'] * 1000:.1f} ms median, "
        f"{row['stall_max_s'] * 1000:.1f} ms max, {row['globals_installed']} globals installed"
    )
    print(f"  stall share       {row['stall_share']:.2%} (target <= {STALL_SHARE_TARGET:.0%})")
    sizes = row["delta_bytes"]
    print(
        f"  bytes per delta   fp32 {sizes['fp32']:,}  bf16 {sizes['bf16']:,}  "
        f"int8 {sizes['int8']:,}  (bf16/fp32 {row['bf16_over_fp32']:.3f})"
    )
    print(json.dumps(row))
    missed = row["stall_share"] > STALL_SHARE_TARGET or abs(row["bf16_over_fp32"] - 0.5) > 0.01
    if args.check and missed:
        sys.exit(1)


if __name__ == "__main__":
    main()

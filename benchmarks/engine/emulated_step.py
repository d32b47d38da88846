"""How much slower a bf16 training step is than an fp32 one, on this CPU: the docs' one figure.

docs/benchmarks.md ("Slow or emulated dtypes") cites one figure for how much slower bf16
trains on a CPU without bf16 arithmetic (issue 31: the docs gave three for one fact). This
script measures it: the config (default: the embedded smoke run) built twice by
``build_runtime``, fp32 and bf16 autocast, one warm-up step each, then ``--steps`` training
steps of each, interleaved so that a busy moment of the machine falls on both alike, each
timed in the calling thread's CPU time (run it with ``OMP_NUM_THREADS=1`` so that is all of
the work). The ratio of the medians is the figure. An AVX2-only CPU is reproduced on one with
AVX512-BF16/AMX by capping oneDNN: ``ONEDNN_MAX_CPU_ISA=AVX2``. Prints a table and one JSON
line:

    ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1 python benchmarks/engine/emulated_step.py [--steps 5]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from speedtronic.config import SpeedtronicConfig  # noqa: E402
from speedtronic.runtime import build_runtime  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", help="config file (default: the embedded smoke run)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per mode (median)")
    options = parser.parse_args()
    base = (
        SpeedtronicConfig.from_file(options.config)
        if options.config
        else SpeedtronicConfig.default()
    )
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    with tempfile.TemporaryDirectory() as scratch:
        runtimes = {}
        for mode in times:
            raw = base.to_dict(redact=False)
            raw["precision"]["mode"], raw["run"]["device"] = mode, "cpu"
            raw["run"]["output_dir"] = str(Path(scratch) / mode)
            runtimes[mode] = build_runtime(raw, console=False)
            runtimes[mode].trainer.train_step()  # warm-up: kernels built for these shapes
        for _ in range(options.steps):
            for mode, runtime in runtimes.items():
                start = time.thread_time()
                runtime.trainer.train_step()
                times[mode].append(time.thread_time() - start)
        for runtime in runtimes.values():
            runtime.logger.close()
    medians = {mode: statistics.median(values) for mode, values in times.items()}
    ratio = medians["bf16"] / medians["fp32"]
    print(f"{'mode':<6} {'median step (thread CPU s)':>28} {'min':>8} {'max':>8}")
    for mode, values in times.items():
        print(f"{mode:<6} {medians[mode]:>28.4f} {min(values):>8.4f} {max(values):>8.4f}")
    print(f"bf16 / fp32: {ratio:.1f}x (ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA')})")
    record = {
        "benchmark": "emulated_step",
        "steps": options.steps,
        "median_step_s": {mode: round(value, 4) for mode, value in medians.items()},
        "bf16_vs_fp32": round(ratio, 2),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_average": os.getloadavg()[0],
    }
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Training on a busy machine: torch's default threads against one thread, under a synthetic load.

docs/troubleshooting.md ("Training is very slow on a busy machine") tells a user whose cores
other processes keep busy to train with ``--threads 1`` (issue 55: on 2 cores at load 8-10, 2
threads trained at ~200 tok/s and 1 thread at ~2,500). This script measures that advice: it
starts ``--busy`` busy-loop processes (default: 4 per core; each ends by itself after
``--max-seconds``, and all are stopped when the measurement ends), builds the config (default:
the embedded smoke run) once with ``build_runtime``, warms each setting up with one step, then
times ``--rounds`` rounds of ``--steps`` optimizer steps per setting, alternating (ABBA) so a
change of the load falls on both. Reported per setting: the median tok/s and the CPU share this
process got (CPU time / (wall * threads), the notice's rule); the figure is the ratio of the
medians, 1 thread / default. Prints a table and one JSON line naming the CPU:

    python benchmarks/engine/busy_threads.py [--busy 8] [--rounds 3] [--steps 4]

``--busy 0`` measures the same on the machine as it is (on a quiet one, the default wins).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from speedtronic.bench import drop_checkpoints  # noqa: E402
from speedtronic.bench.probes import cpu_name  # noqa: E402
from speedtronic.config import SpeedtronicConfig  # noqa: E402
from speedtronic.runtime import build_runtime  # noqa: E402
from speedtronic.train.threads import cpu_share  # noqa: E402

SPIN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end:\n    pass\n"


def start_load(n: int, seconds: float) -> list[subprocess.Popen]:
    """``n`` processes that each keep one core busy for ``seconds`` at most."""
    code = SPIN.format(s=seconds)
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def stop_load(load: list[subprocess.Popen]) -> None:
    for process in load:
        process.kill()
    for process in load:
        process.wait()


def time_round(runtime, threads: int, steps: int) -> tuple[float, float]:
    """(wall, process CPU) seconds of ``steps`` optimizer steps on ``threads`` threads."""
    torch.set_num_threads(threads)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        loss, _ = runtime.trainer.train_step()
    float(loss)  # the last step's work is done before the clock stops
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(args: argparse.Namespace, default: int) -> tuple[dict[str, dict], int]:
    """Per setting, the rounds' wall and CPU seconds; and the tokens of one round."""
    base = SpeedtronicConfig.from_file(args.config) if args.config else SpeedtronicConfig.default()
    raw = base.to_dict(redact=False)
    raw["run"]["device"] = "cpu"
    settings = {"default": default, "one": 1}
    out = {name: {"wall": [], "cpu": []} for name in settings}
    with tempfile.TemporaryDirectory(prefix="speedtronic-busy-") as scratch:
        raw["run"]["output_dir"] = scratch
        runtime = build_runtime(raw, console=False)
        drop_checkpoints(runtime)
        load = start_load(args.busy, args.max_seconds)
        try:
            time.sleep(0.5)  # the load is running before the first step
            for threads in settings.values():
                time_round(runtime, threads, 1)  # warm-up: kernels for these shapes
            for r in range(args.rounds):
                order = list(settings) if r % 2 == 0 else list(settings)[::-1]
                for name in order:
                    wall, cpu = time_round(runtime, settings[name], args.steps)
                    out[name]["wall"].append(wall)
                    out[name]["cpu"].append(cpu)
        finally:
            stop_load(load)
            runtime.logger.close()
            torch.set_num_threads(default)
    return out, args.steps * runtime.config.tokens_per_step


def summarize(measured: tuple[dict, int], args: argparse.Namespace, default: int) -> dict:
    (out, tokens), rows = measured, {}
    for name, threads in (("default", default), ("one", 1)):
        walls, cpus = out[name]["wall"], out[name]["cpu"]
        shares = [cpu_share(c, w, threads) for c, w in zip(cpus, walls, strict=True)]
        rows[name] = {
            "threads": threads,
            "tokens_per_s": statistics.median(tokens / w for w in walls),
            "cpu_share": statistics.median(shares),
        }
    return {
        "benchmark": "busy_threads",
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "busy_processes": args.busy,
        "load_average_before": args.load_before,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "settings": rows,
        "ratio_one_vs_default": rows["one"]["tokens_per_s"] / rows["default"]["tokens_per_s"],
    }


def main() -> int:
    cores = os.cpu_count() or 1
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", help="config file (default: the embedded smoke run)")
    parser.add_argument("--busy", type=int, default=4 * cores, help="busy-loop processes")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="each one's lifetime")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per setting")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per round")
    args = parser.parse_args()
    if args.busy < 0 or args.rounds < 1 or args.steps < 1 or args.max_seconds <= 0:
        parser.error("--busy must be >= 0, --rounds and --steps >= 1, --max-seconds > 0")
    default = torch.get_num_threads()
    args.load_before = os.getloadavg()[0]  # the machine's own load, before ours
    doc = summarize(measure(args, default), args, default)
    load = f"load average before {args.load_before:.1f}"
    print(f"{doc['cpu']}, {cores} cores, {args.busy} busy processes ({load})")
    print(f"{'threads':<18}{'tok/s':>10}{'cpu share':>11}")
    for name, row in doc["settings"].items():
        label = f"{row['threads']} ({name})"
        print(f"{label:<18}{row['tokens_per_s']:>10,.0f}{row['cpu_share']:>11.0%}")
    print(f"1 thread / default: {doc['ratio_one_vs_default']:.2f}x")
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())

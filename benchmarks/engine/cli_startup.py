"""Benchmark of the command line's start-up: ``--help`` and ``validate`` against ``import torch``.

Completion scripts call ``speedtronic`` at every TAB, and ``--help`` is how people look at a
command, so both must answer before a person notices. This script owns that target: the median
wall time of ``python -m speedtronic --help`` is at most ``TARGET`` (0.10) of the median wall
time of ``python -c "import torch"``, the baseline measured in the same run; ``validate`` of the
GPT-2 config (which needs torch, for the device) at most ``VALIDATE_TARGET`` (1.5) of it (issue
31: it built the model, 2.5-3x import torch, 6-38 s on a loaded machine). Each command runs
``--runs`` times in a fresh interpreter, the commands interleaved so that a busy moment of the
machine falls on all of them alike. Also timed, for information: the interpreter alone, a
command's help (``train --help``) and one TAB of bash completion. ``--importtime`` adds the
slowest imports of ``--help`` (``python -X importtime``, cumulative). Prints a table and one JSON
line; ``--check`` exits 1 when the ratio misses the target. Run it from a checkout:

    python benchmarks/engine/cli_startup.py [--runs 7] [--importtime] [--check]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = 0.10
VALIDATE_TARGET = 1.5
BASELINE = "import torch"
COMMANDS: dict[str, tuple[list[str], dict[str, str]]] = {
    "python (interpreter alone)": (["-c", "pass"], {}),
    BASELINE: (["-c", "import torch"], {}),
    "speedtronic --help": (["-m", "speedtronic", "--help"], {}),
    "speedtronic train --help": (["-m", "speedtronic", "train", "--help"], {}),
    "validate -c gpt2_small.yaml": (
        ["-m", "speedtronic", "validate", "-c", str(ROOT / "configs" / "gpt2_small.yaml")],
        {},
    ),
    "TAB: speedtronic ckpt <TAB>": (
        ["-m", "speedtronic"],
        {
            "_SPEEDTRONIC_COMPLETE": "complete_bash",
            "COMP_WORDS": "speedtronic ckpt ",
            "COMP_CWORD": "2",
        },
    ),
}
HELP = "speedtronic --help"
VALIDATE = "validate -c gpt2_small.yaml"


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """This checkout first on the path, so the script measures the code beside it."""
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def wall_time(args: list[str], extra: dict[str, str]) -> float:
    """Seconds one fresh interpreter takes to run ``args`` (output discarded)."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *args], env=child_env(extra), capture_output=True, text=True
    )
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}): {done.stderr[-500:]}")
    return took


def measure(runs: int) -> dict[str, list[float]]:
    """Every command ``runs`` times, interleaved; one untimed round first warms the caches."""
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for round_index in range(runs + 1):
        for name, (args, extra) in COMMANDS.items():
            took = wall_time(args, extra)
            if round_index:
                times[name].append(took)
    return times


def slowest_imports(count: int = 12) -> list[tuple[str, float]]:
    """The ``count`` imports of ``--help`` with the largest cumulative time (ms), once."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "speedtronic", "--help"],
        env=child_env({}),
        capture_output=True,
        text=True,
    )
    found = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.split("|")
        found.append((name.strip(), int(cumulative) / 1000))
    return sorted(found, key=lambda item: -item[1])[:count]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs per command (median)")
    parser.add_argument("--importtime", action="store_true", help="also list the slowest imports")
    parser.add_argument("--check", action="store_true", help="exit 1 if a ratio misses its target")
    options = parser.parse_args()
    times = measure(options.runs)
    medians = {name: statistics.median(values) for name, values in times.items()}
    base = medians[BASELINE]
    print(f"{'command':<30} {'median':>9} {'min':>9} {'max':>9} {'vs import torch':>16}")
    for name, values in times.items():
        print(
            f"{name:<30} {medians[name] * 1000:>7.0f}ms {min(values) * 1000:>7.0f}ms "
            f"{max(values) * 1000:>7.0f}ms {medians[name] / base:>16.3f}"
        )
    ratio, checked = medians[HELP] / base, medians[VALIDATE] / base
    verdict = "meets" if ratio <= TARGET else "misses"
    print(f"--help: {ratio:.3f} of import torch ({verdict} the target <= {TARGET})")
    verdict = "meets" if checked <= VALIDATE_TARGET else "misses"
    print(f"validate: {checked:.3f} of import torch ({verdict} the target <= {VALIDATE_TARGET})")
    ok = ratio <= TARGET and checked <= VALIDATE_TARGET
    imports = slowest_imports() if options.importtime else []
    for name, ms in imports:
        print(f"  import {name:<40} {ms:>7.1f} ms cumulative")
    record = {
        "benchmark": "cli_startup",
        "runs": options.runs,
        "median_s": {name: round(value, 4) for name, value in medians.items()},
        "help_vs_import_torch": round(ratio, 4),
        "target": TARGET,
        "validate_vs_import_torch": round(checked, 4),
        "validate_target": VALIDATE_TARGET,
        "meets_target": ok,
        "slowest_imports_ms": dict(imports),
    }
    print(json.dumps(record))
    return 1 if options.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())

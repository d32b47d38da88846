"""Benchmark of ``speedtronic runs``: listing 1,000 run directories against reading them raw.

Issue 49 asks that 1,000 runs list in seconds. The baseline, measured in the same run, is the
least any listing must do: ``os.scandir`` the folder and read each run's summary.json whole
(``json.loads``, no checks). Measured against it: ``list_runs`` (what ``runs --format json``
prints, before printing) over the same folder, and the whole command in a fresh interpreter
(``python -m speedtronic runs DIR --format json``, start-up included). Two folders: 1,000 runs
with summary.json (the ratio to the baseline), and 1,000 of which half were killed with -9 (no
summary: a checkpoint's latest.json and meta.json and the metrics JSONL's tail are read
instead), and 1,000 of which half were killed before their first checkpoint (``checkpoint.
interval: 0``: ``.running`` naming a dead pid and the metrics JSONL only, its head's run_start
and tail read; issue 53). Prints a table and one JSON line:

    python benchmarks/observe/runs_list.py [--runs 1000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from results.test_runs import summary, write_checkpoint, write_summary  # noqa: E402

from speedtronic.results.listing import list_runs  # noqa: E402


def make_runs(folder: Path, count: int, killed: str | None) -> None:
    """``count`` runs with summary.json; with ``killed``, every other one instead killed with -9
    (no summary; a metrics JSONL of 400 train_steps): after a checkpoint (``"checkpoint"``) or
    before its first (``"fresh"``: ``.running`` and the JSONL only)."""
    config = {"optimizer": {"name": "muon"}, "logging": {"json_file": "metrics.jsonl"}}
    start = json.dumps({"event": "run_start", "name": "r", "params": 1000, "optimizer": "muon"})
    lines = [json.dumps({"event": "train_step", "step": s, "loss": 3.0}) for s in range(400)]
    for i in range(count):
        run = folder / f"run{i:04d}"
        if killed is None or i % 2 == 0:
            write_summary(run, summary(name=run.name))
            continue
        if killed == "checkpoint":
            write_checkpoint(run, 400, config)
        else:
            run.mkdir(parents=True)
            (run / ".running").write_text(f"999999999 {socket.gethostname()}\n")
        (run / "metrics.jsonl").write_text("\n".join([start, *lines]) + "\n")


def raw_read(folder: Path) -> int:
    """The baseline: scandir, then each summary.json read whole and parsed."""
    read = 0
    with os.scandir(folder) as entries:
        for entry in entries:
            try:
                with open(os.path.join(entry.path, "summary.json"), "rb") as handle:
                    json.loads(handle.read())
                read += 1
            except FileNotFoundError:
                pass
    return read


def timed(call, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def command(folder: Path) -> None:
    args = [sys.executable, "-m", "speedtronic", "runs", str(folder), "--format", "json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(args, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"runs failed: {done.stderr[-400:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="synthetic run directories")
    parser.add_argument("--repeat", type=int, default=5, help="timed repeats (median)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        summaries, mixed, fresh = (Path(tmp) / n for n in ("summaries", "mixed", "fresh"))
        make_runs(summaries, options.runs, killed=None)
        make_runs(mixed, options.runs, killed="checkpoint")
        make_runs(fresh, options.runs, killed="fresh")
        for folder in (summaries, mixed, fresh):  # warms the page cache for every side
            assert len(list_runs([folder])) == options.runs
        raw_read(summaries)
        times = {
            "baseline: scandir + json.loads": timed(lambda: raw_read(summaries), options.repeat),
            "list_runs, all with summary": timed(lambda: list_runs([summaries]), options.repeat),
            "list_runs, half killed (no summary)": timed(
                lambda: list_runs([mixed]), options.repeat
            ),
            "list_runs, half killed before a checkpoint": timed(
                lambda: list_runs([fresh]), options.repeat
            ),
            "runs --format json, half killed": timed(lambda: command(mixed), options.repeat),
        }
    medians = {name: statistics.median(values) for name, values in times.items()}
    base = next(iter(medians.values()))
    print(f"{options.runs} run directories; median of {options.repeat}")
    print(f"{'what':<44} {'median':>9} {'min':>9} {'vs baseline':>12}")
    for name, values in times.items():
        ratio = medians[name] / base
        print(f"{name:<44} {medians[name]:>8.3f}s {min(values):>8.3f}s {ratio:>12.1f}")
    names = ("baseline_s", "summaries_s", "half_killed_s", "no_checkpoint_s", "command_s")
    doc = {"runs": options.runs, **dict(zip(names, medians.values(), strict=True))}
    doc["summaries_vs_baseline"] = doc["summaries_s"] / base
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())

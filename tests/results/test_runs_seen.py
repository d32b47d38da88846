"""Issue 53: every run is seen from its first step, and only its own files describe it.

A run trained with the default ``checkpoint.interval: 0`` has no checkpoint until it ends:
while it trains, and after a kill -9, its directory holds ``.running`` and its metrics JSONL
only. ``speedtronic runs`` lists it from them. A run's stored paths (``run.output_dir``) are
never resolved against the caller's working directory: a run without its own log has no
curve, not another run's.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

from results.test_runs import row_of, write_checkpoint
from speedtronic.observe.running import RUNNING_FILE, claim, release
from speedtronic.results.compare import compare_runs
from speedtronic.results.listing import list_runs


def write_log(run: Path, steps: int, name: str = "metrics.jsonl", end: bool = False) -> Path:
    """A metrics JSONL as ``train`` writes it: run_start, one train_step per step."""
    run.mkdir(parents=True, exist_ok=True)
    start = {"event": "run_start", "name": run.name, "params": 18528, "optimizer": "adamw (fused)"}
    records = [start]
    for step in range(1, steps + 1):
        loss = 5.0 - step / 10
        records.append(
            {
                "event": "train_step",
                "step": step,
                "loss": loss,
                "tokens": 128 * step,
                "steps_per_s": 10.0,
                "tokens_per_s": 1280.0,
            }
        )
    if end:
        records.append({"event": "run_end", "status": "completed", "elapsed_s": 2.0})
    path = run / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_training_and_a_killed_run_without_checkpoints_are_listed(tmp_path):
    live = tmp_path / "live"
    write_log(live, 12)
    held = claim(live)  # this process: alive
    assert held is not None
    killed = tmp_path / "killed"
    write_log(killed, 7)
    (killed / RUNNING_FILE).write_text(f"999999999 {socket.gethostname()}\n")  # a dead pid
    rows = list_runs([tmp_path])
    assert [r["name"] for r in rows] == ["killed", "live"]
    one = row_of(rows, "live")
    assert (one["status"], one["steps"], one["tokens"]) == ("running", 12, 12 * 128)
    assert abs(one["final_loss"] - 3.8) < 1e-9 and one["tokens_per_s"] == 1280.0
    assert (one["params"], one["optimizer"], one["problem"]) == (18528, "adamw", None)
    other = row_of(rows, "killed")
    assert (other["status"], other["steps"], other["problem"]) == ("interrupted", 7, None)
    release(held)


def test_a_run_without_its_log_never_borrows_the_one_at_its_stored_output_dir(
    tmp_path, monkeypatch
):
    """The run's meta.json says ``run.output_dir: runs/b``: from a cwd where runs/b holds
    another run's log, the copy still has no curve, no time and its own status."""
    config = {"run": {"output_dir": "runs/b"}, "logging": {"json_file": "metrics.jsonl"}}
    copy = write_checkpoint(tmp_path / "copy", 20, config)
    other = tmp_path / "cwd" / "runs" / "b"
    write_log(other, 499, end=True)
    monkeypatch.chdir(tmp_path / "cwd")
    [row] = list_runs([tmp_path / "copy"])
    assert (row["status"], row["train_s"], row["steps"]) == ("interrupted", None, 20)
    assert "metrics.jsonl" in (row["problem"] or "")  # it says its log is missing
    second = write_checkpoint(tmp_path / "second", 20, config)
    doc = compare_runs([copy, second], "steps")
    assert doc["series"] == []
    assert any("no curve" in w and str(copy) in w for w in doc["warnings"])

"""``speedtronic.results.listing`` and ``compare``: rows from summary.json or from checkpoints and
the metrics JSONL, bounded reads, the keys that differ, and curves on one axis.

Fixtures are written by hand in the shapes ``train`` writes (summary.json's schema from issue
49, meta.json and latest.json from docs/checkpoints.md); tests/cli/test_runs_cli.py lists a
real run.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from speedtronic.errors import ConfigError
from speedtronic.results.compare import char_plot, compare_runs, curve_from_metrics
from speedtronic.results.listing import find_runs, list_runs, sort_rows


def summary(name: str = "r", **changes) -> dict:
    doc = {
        "schema_version": 1,
        "name": name,
        "status": "completed",
        "error": None,
        "stop_reason": "max_steps",
        "started_at": "2026-01-01T00:00:00Z",
        "ended_at": "2026-01-01T00:01:00Z",
        "steps": 100,
        "tokens": 12800,
        "train_s": 60.0,
        "startup_s": 2.0,
        "time_budget_s": 60.0,
        "params": 1000,
        "tokens_per_s": 213.3,
        "mfu": None,
        "peak_memory_bytes": None,
        "optimizer": "adamw",
        "final_train_loss": 3.0,
        "eval": {"val": {"loss": 3.2, "bits_per_byte": 1.5}},
        "config_sha256": "0" * 64,
        "changed_keys": ["optimizer.name"],
        "config": {"optimizer": {"name": "adamw", "lr": 0.001}, "model": {"vocab_size": 256}},
        "tokenizer": {"kind": "byte", "vocab_size": 256},
        "role": None,
        "node_id": None,
        "outer_step": None,
        "curve": {
            "train": [[1, 128, 0.5, 5.0], [50, 6400, 30.0, 3.5], [100, 12800, 60.0, 3.0]],
            "eval": [[50, 6400, 30.0, "val", 3.6, 1.7], [100, 12800, 60.0, "val", 3.2, 1.5]],
        },
    }
    doc.update(changes)
    return doc


def write_summary(run: Path, doc: dict) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "summary.json").write_text(json.dumps(doc))
    return run


def write_checkpoint(run: Path, step: int, config: dict | None = None, **meta) -> Path:
    """A checkpoint's meta.json and latest.json (no weights: runs never opens them)."""
    folder = run / "checkpoints" / f"step_{step:010d}"
    folder.mkdir(parents=True)
    doc = {"step": step, "run_id": "abc", "tokens": step * 128, "loss": 3.3}
    doc.update(param_count=1000, config=config or {"optimizer": {"name": "muon"}}, **meta)
    (folder / "meta.json").write_text(json.dumps(doc))
    latest = {"step": step, "path": folder.name}
    (run / "checkpoints" / "latest.json").write_text(json.dumps(latest))
    return run


def row_of(rows: list[dict], name: str) -> dict:
    return next(r for r in rows if r["name"] == name)


def test_rows_from_summaries_and_checkpoints(tmp_path):
    write_summary(tmp_path / "done", summary())
    write_summary(tmp_path / "sweep" / "broke", summary(status="failed", error="OOM"))
    write_summary(tmp_path / "halted", summary(status="stopped", stop_reason="time_budget"))
    write_checkpoint(tmp_path / "killed", 40)
    (tmp_path / "not-a-run" / "logs").mkdir(parents=True)
    rows = list_runs([tmp_path])
    assert [r["name"] for r in rows] == ["done", "halted", "killed", "sweep/broke"]
    done = row_of(rows, "done")
    assert (done["status"], done["steps"], done["train_s"], done["source"]) == (
        "completed",
        100,
        60.0,
        "summary",
    )
    assert (done["best_eval_loss"], done["bits_per_byte"]) == (3.2, 1.5)
    assert row_of(rows, "sweep/broke")["status"] == "failed"
    assert row_of(rows, "sweep/broke")["error"] == "OOM"
    assert row_of(rows, "halted")["status"] == "stopped"
    killed = row_of(rows, "killed")
    assert (killed["status"], killed["steps"], killed["tokens"]) == ("interrupted", 40, 5120)
    assert (killed["optimizer"], killed["source"], killed["problem"]) == (
        "muon",
        "checkpoints",
        None,
    )


def test_a_run_without_summary_ends_as_its_jsonl_says_or_is_running(tmp_path):
    config = {"logging": {"json_file": "m.jsonl"}}
    finished = write_checkpoint(tmp_path / "old", 10, config)
    events = [{"event": "run_start"}, {"event": "train_step", "step": 10, "tokens_per_s": 99.0}]
    end = {"event": "run_end", "status": "completed", "elapsed_s": 7.5}
    (finished / "m.jsonl").write_text("\n".join(json.dumps(e) for e in [*events, end]))
    live = write_checkpoint(tmp_path / "live", 10, config)
    (live / "m.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    stale = write_checkpoint(tmp_path / "stale", 10, config)
    (stale / "m.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    os.utime(stale / "m.jsonl", (time.time() - 3600,) * 2)
    rows = list_runs([tmp_path])
    old = row_of(rows, "old")
    assert (old["status"], old["train_s"], old["tokens_per_s"]) == ("completed", 7.5, 99.0)
    assert row_of(rows, "live")["status"] == "running"
    assert row_of(rows, "stale")["status"] == "interrupted"


def test_dumbdiloco_nodes_are_rows_with_role_and_outer_step(tmp_path):
    node = {"enabled": True, "role": "master", "node_id": "m0"}
    master = write_checkpoint(tmp_path / "master", 30, {"distributed": node})
    (master / "diloco_master").mkdir()
    for step in (6, 7):
        (master / "diloco_master" / f"step_{step:010d}.json").write_text("{}")
    write_summary(tmp_path / "w1", summary(role="worker", node_id="w1", outer_step=5))
    rows = list_runs([tmp_path])
    assert [(r["role"], r["node_id"], r["outer_step"]) for r in rows] == [
        ("master", "m0", 7),
        ("worker", "w1", 5),
    ]


def test_a_corrupt_or_huge_file_is_named_on_its_row(tmp_path):
    write_summary(tmp_path / "corrupt", summary()).joinpath("summary.json").write_text("{oops")
    huge = tmp_path / "huge" / "summary.json"
    huge.parent.mkdir()
    with huge.open("wb") as handle:
        handle.truncate(100 << 20)  # sparse: 100 MB on paper, nothing on disk
    write_checkpoint(tmp_path / "badmeta", 5)
    (tmp_path / "badmeta/checkpoints/step_0000000005/meta.json").write_text("[1, 2")
    start = time.perf_counter()
    rows = list_runs([tmp_path])
    assert time.perf_counter() - start < 2.0  # the 100 MB file is never read
    for name in ("corrupt", "huge"):
        row = row_of(rows, name)
        assert (
            row["status"] == "unknown" and str(tmp_path / name / "summary.json") in row["problem"]
        )
    assert "must be at most 4 MiB" in row_of(rows, "huge")["problem"]
    assert "meta.json: not valid JSON" in row_of(rows, "badmeta")["problem"]


def test_sort_orders_by_a_column_and_refuses_an_unknown_one(tmp_path):
    for name, loss in (("a", 3.0), ("b", 2.0), ("c", None)):
        write_summary(tmp_path / name, summary(final_train_loss=loss))
    rows = list_runs([tmp_path])
    assert [r["name"] for r in sort_rows(rows, "loss")] == ["b", "a", "c"]
    with pytest.raises(ConfigError, match="one of: name, status"):
        sort_rows(rows, "lossy")


def test_a_missing_directory_is_one_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        find_runs([tmp_path / "nowhere"])


def test_compare_shows_exactly_the_keys_that_differ(tmp_path):
    a = write_summary(tmp_path / "a", summary())
    config = {"optimizer": {"name": "muon", "lr": 0.001}, "model": {"vocab_size": 256}, "x": 1}
    b = write_summary(tmp_path / "b", summary(config=config))
    doc = compare_runs([a, b], "steps")
    assert doc["differing_keys"] == {"optimizer.name": ["adamw", "muon"], "x": [None, 1]}
    assert (doc["metric"], doc["note"]) == ("loss", None)
    train = [s for s in doc["series"] if s["kind"] == "train"]
    assert train[0]["points"] == [[1, 5.0], [50, 3.5], [100, 3.0]]
    assert len(doc["grid"]) == len(doc["aligned"][0]) and doc["aligned"][0][-1] == 3.0


def test_runs_with_other_tokenizers_compare_bits_per_byte(tmp_path):
    a = write_summary(tmp_path / "a", summary())
    other = {"kind": "file", "file": "tokenizer.json", "vocab_size": 8192}
    b = write_summary(tmp_path / "b", summary(tokenizer=other))
    doc = compare_runs([a, b], "tokens")
    assert doc["metric"] == "bits_per_byte" and "bits per byte, not loss" in doc["note"]
    assert {s["kind"] for s in doc["series"]} == {"eval"}
    assert doc["series"][0]["points"] == [[6400, 1.7], [12800, 1.5]]
    assert char_plot(doc["series"])  # something to draw


def test_curves_come_from_the_metrics_jsonl_without_summary(tmp_path):
    lines = [
        {"event": "run_start"},
        {"event": "train_step", "step": 2, "tokens": 256, "loss": 4.0, "steps_per_s": 2.0},
        {"event": "eval", "step": 2, "eval_loss": 4.5},
        {"event": "train_step", "step": 4, "tokens": 512, "loss": 3.0, "steps_per_s": 1.0},
        {"event": "eval_set", "step": 4, "set": "prose", "loss": 3.1, "bits_per_byte": 1.2},
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(map(json.dumps, lines)) + "\nnot json\n")
    curve = curve_from_metrics(path, {})
    assert curve["train"] == [[2, 256, 1.0, 4.0], [4, 512, 3.0, 3.0]]
    assert curve["eval"] == [[2, 256, 1.0, "val", 4.5, None], [4, 512, 3.0, "prose", 3.1, 1.2]]


def test_compare_needs_two_run_directories(tmp_path):
    a = write_summary(tmp_path / "a", summary())
    with pytest.raises(ConfigError, match="at least two"):
        compare_runs([a], "tokens")
    with pytest.raises(ConfigError, match="not a run directory"):
        compare_runs([a, tmp_path], "tokens")

"""`speedtronic ckpt inspect` / `ckpt prune` on real checkpoints written by a training run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from speedtronic.cli.app import app
from speedtronic.runtime import train_from_config

runner = CliRunner()


@pytest.fixture
def run_dir(tiny, tmp_path):
    """A run with checkpoints at steps 2, 4, 6 (latest), one damaged copy and one torn write."""
    tiny["checkpoint"] = {"interval": 2, "keep_last": 5}
    tiny["logging"]["json_file"] = "metrics.jsonl"
    train_from_config(tiny, console=False)
    ckpts = tmp_path / "run" / "checkpoints"
    shutil.copytree(ckpts / "step_0000000002", ckpts / "step_0000000001")
    model = ckpts / "step_0000000001" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:-16])
    shutil.copytree(ckpts / "step_0000000004", ckpts / ".tmp-step_0000000008-999999")
    (ckpts / ".tmp-step_0000000008-999999" / "meta.json").unlink()
    return tmp_path / "run"


def test_inspect_json_reports_every_checkpoint_with_status(run_dir):
    result = runner.invoke(app, ["ckpt", "inspect", str(run_dir), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    by_name = {c["name"]: c for c in report["checkpoints"]}
    assert report["latest"] == "step_0000000006"
    assert by_name["step_0000000006"]["is_latest"] and by_name["step_0000000006"]["step"] == 6
    assert by_name["step_0000000001"]["status"] == "damaged"
    assert by_name[".tmp-step_0000000008-999999"]["status"] == "incomplete"
    ok = by_name["step_0000000004"]
    assert ok["status"] == "unverified" and ok["tokens"] == 4 * 8 * 16 and ok["samples"] == 32
    assert set(ok["dtypes"]) == {"float32"}
    assert set(ok["params_by_module"]) == {"tok_emb", "blocks", "norm"}
    assert sum(m["params"] for m in ok["params_by_module"].values()) == ok["param_count"]
    assert sum(m["size_bytes"] for m in ok["params_by_module"].values()) == 4 * ok["param_count"]
    assert ok["config_facts"]["model"] == "reference_transformer"
    assert report["schema_version"] == 1


def test_inspect_shows_the_runs_loss_history(run_dir):
    result = runner.invoke(app, ["ckpt", "inspect", str(run_dir), "--format", "json"])
    history = json.loads(result.stdout)["history"]
    assert history["path"] == str(run_dir / "metrics.jsonl") and not history["truncated"]
    assert [p["step"] for p in history["losses"]] == [1, 2, 4, 6]
    assert history["loss_points"] == 4 and history["last_loss_step"] == 6
    assert history["first_loss"] == history["losses"][0]["loss"]
    assert history["min_loss"] == min(p["loss"] for p in history["losses"])
    assert len(history["loss_sparkline"]) == 4 and history["eval_loss_points"] == 0
    for path in (run_dir, run_dir / "checkpoints" / "step_0000000004"):  # one checkpoint too
        text = runner.invoke(app, ["ckpt", "inspect", str(path)]).stdout
        assert "loss history from" in text and history["loss_sparkline"] in text
    (run_dir / "metrics.jsonl").unlink()
    result = runner.invoke(app, ["ckpt", "inspect", str(run_dir), "--format", "json"])
    assert json.loads(result.stdout)["history"] is None
    assert "loss history" not in runner.invoke(app, ["ckpt", "inspect", str(run_dir)]).stdout


def jsonl(*records: dict | str) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def test_history_keeps_the_last_run_and_survives_damage(tmp_path):
    from speedtronic.observe.history import read_history

    path = tmp_path / "m.jsonl"
    path.write_text(
        jsonl(
            {"event": "run_start"},
            *({"event": "train_step", "step": s, "loss": 10.0 - s} for s in (1, 2, 3, 4)),
            {"event": "eval", "step": 4, "eval_loss": 7.0},
            '{"event": "train_step", "step": 5, "lo',  # cut by a kill
            {"event": "notice", "message": "resumed from step 2"},
            *({"event": "train_step", "step": s, "loss": 5.0 - s} for s in (3, 4)),
            {"event": "train_step", "step": 5, "loss": None},  # non-finite, written as null
            {"event": "eval", "step": 5, "eval_loss": 0.5},
            "garbage",
        )
    )
    history = read_history(path)
    assert [(p["step"], p["loss"]) for p in history["losses"]] == [
        (1, 9.0),
        (2, 8.0),
        (3, 2.0),
        (4, 1.0),
        (5, None),
    ]
    assert history["min_loss"] == 1.0 and history["min_loss_step"] == 4
    assert history["last_loss"] is None and history["loss_sparkline"] == "█▇▂▁ "
    assert history["eval_losses"] == [{"step": 5, "eval_loss": 0.5}]


def test_history_of_a_huge_file_is_read_capped(tmp_path):
    from speedtronic.observe.history import MAX_POINTS, read_history

    path = tmp_path / "m.jsonl"
    records = ({"event": "train_step", "step": s, "loss": 1000.0 / s} for s in range(1, 20001))
    path.write_text(jsonl(*records))
    full = read_history(path)
    assert full["loss_points"] == 20000 and len(full["losses"]) == MAX_POINTS
    assert full["losses"][-1] == {"step": 20000, "loss": 0.05}
    capped = read_history(path, max_bytes=path.stat().st_size // 4)
    assert capped["truncated"] and capped["first_loss"] == 1000.0
    assert capped["last_loss_step"] == 20000 and capped["loss_points"] < 20000 // 3


def test_inspect_text_for_one_checkpoint_and_for_the_checkpoints_dir(run_dir):
    for path in (run_dir / "checkpoints", run_dir / "checkpoints" / "step_0000000004"):
        result = runner.invoke(app, ["ckpt", "inspect", str(path)])
        assert result.exit_code == 0, result.stderr
        assert "step_0000000004" in result.stdout and "parameters by module" in result.stdout


def test_inspect_nothing_there_is_exit_2_with_one_line(tmp_path):
    result = runner.invoke(app, ["ckpt", "inspect", str(tmp_path)])
    assert result.exit_code == 2 and "no checkpoints found" in result.stderr
    assert "Traceback" not in result.stderr


def test_inspect_does_not_import_torch(run_dir):
    code = (
        "import sys; from typer.testing import CliRunner; from speedtronic.cli.app import app;"
        f"r = CliRunner().invoke(app, ['ckpt', 'inspect', {str(run_dir)!r}, '--format', 'json']);"
        "assert r.exit_code == 0, r.stderr; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def names(run_dir):
    return sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))


def test_prune_dry_run_changes_nothing(run_dir):
    before = names(run_dir)
    result = runner.invoke(app, ["ckpt", "prune", str(run_dir), "--keep", "1", "--dry-run"])
    assert result.exit_code == 0
    assert "would delete" in result.stdout and "step_0000000002" in result.stdout
    assert names(run_dir) == before


def test_prune_yes_deletes_older_and_keeps_latest(run_dir):
    result = runner.invoke(app, ["ckpt", "prune", str(run_dir), "--keep", "2", "--yes"])
    assert result.exit_code == 0, result.stderr
    # step 1 is damaged: prune never deletes those, it says so and leaves them to a person.
    assert names(run_dir) == ["step_0000000001", "step_0000000004", "step_0000000006"]
    assert "leaving" in result.stdout and "step_0000000001: damaged" in result.stdout


def test_prune_never_deletes_what_latest_points_to(run_dir):
    ckpts = run_dir / "checkpoints"
    (ckpts / "latest.json").write_text(json.dumps({"step": 2, "path": "step_0000000002"}))
    result = runner.invoke(app, ["ckpt", "prune", str(run_dir), "--keep", "1", "--yes"])
    assert result.exit_code == 0
    assert names(run_dir) == ["step_0000000001", "step_0000000002", "step_0000000006"]


def test_prune_asks_and_refuses_without_a_terminal_or_yes(run_dir):
    before = names(run_dir)
    result = runner.invoke(app, ["ckpt", "prune", str(run_dir), "--keep", "1"])
    assert result.exit_code == 2 and "pass --yes" in result.stderr
    assert names(run_dir) == before


@pytest.mark.parametrize("args", [["--keep", "0"], ["--keep", "x"], []])
def test_prune_bad_arguments_exit_2(run_dir, args):
    result = runner.invoke(app, ["ckpt", "prune", str(run_dir), *args, "--yes"])
    assert result.exit_code == 2


def test_failed_checkpoint_write_is_a_clear_error_and_keeps_the_previous(
    tiny, tmp_path, monkeypatch
):
    import errno
    import os

    import yaml

    from speedtronic.checkpoint import find_latest

    tiny["checkpoint"] = {"interval": 2}
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny))
    real_fsync, calls = os.fsync, []

    def fsync_until_disk_full(fd):
        calls.append(fd)
        if len(calls) > 12:  # the first checkpoint (step 2) lands, a later one hits ENOSPC
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync_until_disk_full)
    result = runner.invoke(app, ["train", "-c", str(config)])
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert result.exit_code == 1
    assert "could not write checkpoint to" in result.stderr
    assert "No space left on device" in result.stderr and "Traceback" not in result.stderr
    ckpts = tmp_path / "run" / "checkpoints"
    assert find_latest(ckpts).name == "step_0000000002"
    assert not list(ckpts.glob(".tmp-*"))

"""One run per output directory (issue 21, item 1).

Training twice into one directory used to start the second run fresh without a word, save
beside the first run's checkpoints and repoint latest.json at its own; ``ckpt prune`` then said
"nothing to prune" beside two checkpoints. Now a fresh run refuses such a directory (exit 2,
naming --resume, --output-dir and --overwrite), ``--overwrite`` replaces the old run, and prune
says why it keeps each checkpoint it keeps.
"""

from __future__ import annotations

import json
import shutil

import yaml
from typer.testing import CliRunner

from speedtronic.checkpoint.files import write_latest
from speedtronic.checkpoint.layout import list_step_dirs, read_latest
from speedtronic.cli.app import app

runner = CliRunner()


def train(tiny, tmp_path, *args: str):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny))
    return runner.invoke(app, ["train", "-c", str(config), *args])


def run_ids(root) -> list[str]:
    return [json.loads((d / "meta.json").read_text())["run_id"] for d in list_step_dirs(root)]


def snapshot(root) -> dict[str, str]:
    """Every file under ``root`` with its content's hash: what "nothing changed" means."""
    import hashlib

    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_a_second_fresh_run_in_the_same_directory_is_refused(tiny, tmp_path):
    tiny["logging"]["json_file"] = "metrics.jsonl"
    assert train(tiny, tmp_path, "--max-steps", "4").exit_code == 0
    run_dir = tmp_path / "run"
    before = snapshot(run_dir)
    result = train(tiny, tmp_path, "--max-steps", "2")
    assert result.exit_code == 2, result.output
    error, hint = result.stderr.strip().splitlines()
    assert error.startswith(f"speedtronic: error: run.output_dir: {run_dir} already holds a run")
    assert "step 4" in error
    for option in ("--resume", "--output-dir", "--overwrite"):
        assert option in error
    assert hint.startswith("hint: in a config: checkpoint.resume: true")
    assert snapshot(run_dir) == before  # refused before anything was written
    assert read_latest(run_dir / "checkpoints") == "step_0000000004"


def test_an_explicit_checkpoint_directory_is_named_by_its_key(tiny, tmp_path):
    tiny["checkpoint"] = {"directory": str(tmp_path / "ckpts")}
    assert train(tiny, tmp_path, "--max-steps", "2").exit_code == 0
    result = train(tiny, tmp_path, "--max-steps", "2")
    assert result.exit_code == 2
    assert f"checkpoint.directory: {tmp_path / 'ckpts'} already holds a run" in result.stderr


def test_resume_still_continues_the_run_in_the_directory(tiny, tmp_path):
    assert train(tiny, tmp_path, "--max-steps", "2").exit_code == 0
    result = train(tiny, tmp_path, "--max-steps", "4", "--resume")
    assert result.exit_code == 0, result.output
    root = tmp_path / "run" / "checkpoints"
    assert read_latest(root) == "step_0000000004" and len(set(run_ids(root))) == 1


def test_overwrite_replaces_the_old_run_and_its_logs(tiny, tmp_path):
    tiny["logging"]["json_file"] = "metrics.jsonl"
    assert train(tiny, tmp_path, "--max-steps", "4").exit_code == 0
    root = tmp_path / "run" / "checkpoints"
    old_run = run_ids(root)[0]
    result = train(tiny, tmp_path, "--max-steps", "2", "--overwrite")
    assert result.exit_code == 0, result.output
    assert "--overwrite: deleted the previous run" in result.stderr
    assert [d.name for d in list_step_dirs(root)] == ["step_0000000002"]
    assert read_latest(root) == "step_0000000002" and old_run not in run_ids(root)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [r["event"] for r in records].count("run_start") == 1  # only the new run's
    # a directory that holds no run: --overwrite has nothing to delete and says nothing
    tiny["run"]["output_dir"] = str(tmp_path / "fresh")
    result = train(tiny, tmp_path, "--max-steps", "2", "--overwrite")
    assert result.exit_code == 0 and "--overwrite" not in result.stderr


def test_resume_and_overwrite_together_are_a_usage_error(tiny, tmp_path):
    result = train(tiny, tmp_path, "--resume", "--overwrite")
    assert result.exit_code == 2
    assert "checkpoint.overwrite: not with checkpoint.resume" in result.stderr


def test_prune_says_why_it_keeps_each_checkpoint(tiny, tmp_path):
    # A directory mixed by the old behaviour: run A's step 4, then run B's step 2 as latest.
    assert train(tiny, tmp_path, "--max-steps", "4").exit_code == 0
    tiny["run"]["output_dir"] = str(tmp_path / "other")
    assert train(tiny, tmp_path, "--max-steps", "2").exit_code == 0
    root = tmp_path / "run" / "checkpoints"
    shutil.copytree(
        tmp_path / "other" / "checkpoints" / "step_0000000002", root / "step_0000000002"
    )
    write_latest(root, 2, "step_0000000002")
    result = runner.invoke(
        app, ["ckpt", "prune", str(tmp_path / "run"), "--keep", "1", "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    newest = next(line for line in lines if "step_0000000004" in line)
    latest = next(line for line in lines if "step_0000000002" in line)
    assert newest.startswith("keeping ") and "the newest complete checkpoint (--keep 1)" in newest
    assert "written by another run (run_id " in newest
    assert latest.startswith("keeping ") and "latest.json points to it" in latest
    assert lines[-1] == "nothing to prune"

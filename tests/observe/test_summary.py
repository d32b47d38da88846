"""summary.json, the one record every run leaves: written when a run completes or fails, shown
by ``train`` as a greppable block or (``--format json``) as the document on stdout."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from speedtronic.cli.app import app
from speedtronic.errors import TrainingError
from speedtronic.observe.summary import changed_keys, evenly
from speedtronic.runtime import train_from_config

runner = CliRunner()


class FailAt:
    def after_optimizer_step(self, trainer) -> None:
        if trainer.step == 3:
            raise TrainingError("step 3: the disk caught fire\nsecond line")


def read_summary(tiny) -> dict:
    return json.loads((tmp_dir(tiny) / "summary.json").read_text())


def tmp_dir(tiny) -> Path:
    return Path(tiny["run"]["output_dir"])


def test_a_failed_run_writes_status_failed_with_the_errors_line(tiny):
    try:
        train_from_config(tiny, console=False, plugins=[FailAt()])
    except TrainingError:
        pass
    summary = read_summary(tiny)
    assert summary["status"] == "failed" and summary["stop_reason"] == "error"
    assert summary["error"] == "step 3: the disk caught fire"
    assert summary["steps"] == 3 and summary["train_s"] >= 0
    assert not list(tmp_dir(tiny).glob(".summary.json.*"))  # no temporary file left

    class Absent:  # --overwrite deletes the old run's summary with its checkpoints
        def on_train_start(self, trainer) -> None:
            assert not (tmp_dir(tiny) / "summary.json").exists()

    tiny["checkpoint"] = {"overwrite": True}
    train_from_config(tiny, console=False, plugins=[Absent()])
    assert read_summary(tiny)["status"] == "completed"


def test_train_ends_with_the_summary_block_and_json_on_request(tiny, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny))
    text = runner.invoke(app, ["train", "-c", str(path), "--max-steps", "3"])
    assert text.exit_code == 0, text.stderr
    block = [line for line in text.stdout.splitlines() if line.startswith("summary: ")]
    assert block[:4] == [
        "summary: name tiny",
        "summary: status completed",
        "summary: error -",
        "summary: stop_reason max_steps",
    ]
    assert "summary: steps 3" in block and text.stdout.rstrip().endswith(block[-1])
    assert "summary: changed_keys " in "\n".join(block)
    again = runner.invoke(
        app, ["train", "-c", str(path), "--max-steps", "4", "--resume", "--format", "json"]
    )
    assert again.exit_code == 0, again.stderr
    doc = json.loads(again.stdout)  # the whole of stdout: one document
    assert doc == read_summary(tiny)
    assert doc["steps"] == 4 and doc["schema_version"] == 1
    assert doc["config"]["run"]["max_steps"] == 4
    assert [p[0] for p in doc["curve"]["train"]] == [1, 2, 3, 4]
    assert len(doc["config_sha256"]) == 64 and "run.max_steps" in doc["changed_keys"]


def test_json_summary_and_json_events_both_want_stdout(tiny):
    result = runner.invoke(app, ["train", "--format", "json", "--log-format", "json"])
    assert result.exit_code == 2 and "choose one" in result.stderr
    result = runner.invoke(app, ["train", "--time-budget", "soon"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0].startswith("speedtronic: error: --time-budget:")


def test_curves_are_thinned_evenly_and_keys_compared_flat():
    points = list(range(1000))
    kept = evenly(points, 256)
    assert len(kept) == 256 and kept[0] == 0 and kept[-1] == 999
    mine = {"run": {"name": "a", "seed": 0}, "model": {"d": 1}}
    assert changed_keys(mine, {"run": {"name": "b", "seed": 0}}) == ["model.d", "run.name"]

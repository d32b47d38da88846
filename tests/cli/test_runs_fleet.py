"""``speedtronic runs`` over a fleet (issue 55, item 12): a DumbDiLoCo node's loss is its own
training loss, on its local weights between rounds, not the fleet's model (its final_global/);
the table marks those cells and says so under it, and points at how to score the fleet's."""

from __future__ import annotations

from results.test_runs import summary, write_summary
from typer.testing import CliRunner

from speedtronic.cli.app import app

runner = CliRunner()


def test_a_fleet_nodes_loss_is_labelled_its_own_training_loss(tmp_path):
    write_summary(tmp_path / "w1", summary(role="worker", node_id="w1", final_train_loss=2.5))
    write_summary(tmp_path / "solo", summary(final_train_loss=3.0))
    result = runner.invoke(app, ["runs", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    [w1] = [line for line in lines if line.startswith("w1 ")]
    [solo] = [line for line in lines if line.startswith("solo ")]
    assert "2.5000*" in w1 and "3.0000*" not in solo and "3.0000" in solo
    note = lines[-1]
    assert note.startswith("* a DumbDiLoCo node's own training loss"), lines
    assert "final_global" in note and "speedtronic eval" in note, note


def test_no_note_without_a_fleet(tmp_path):
    write_summary(tmp_path / "solo", summary(final_train_loss=3.0))
    result = runner.invoke(app, ["runs", str(tmp_path)])
    assert result.exit_code == 0 and "*" not in result.stdout, result.stdout

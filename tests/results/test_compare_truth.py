"""Issue 53: ``runs compare`` says true things and draws like a W&B chart.

Across tokenizers without eval sets it says bits per byte is missing and shows the train loss
(item 7); 36 runs or more are drawn, past the marks refused in one line; the picture has every
logged point, log x (optional log y), W&B's smoothing, and a fleet's nodes and final global
told apart (item 11).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from results.test_runs import summary, write_summary
from speedtronic.cli.app import app
from speedtronic.results.compare import MARKS, compare_runs, smooth

runner = CliRunner()
NO_BPB = {"val": {"loss": 3.2, "bits_per_byte": None}}
OTHER = {"kind": "file", "file": "tokenizer.json", "vocab_size": 8192}


def no_bpb(**changes) -> dict:
    """A summary whose only eval is data.eval_every's split (no bits per byte)."""
    doc = summary(eval=NO_BPB, **changes)
    doc["curve"]["eval"] = [[p[0], p[1], p[2], "val", p[4], None] for p in doc["curve"]["eval"]]
    return doc


def test_other_tokenizers_without_eval_sets_show_train_loss_and_say_what_is_missing(tmp_path):
    a = write_summary(tmp_path / "a", no_bpb())
    b = write_summary(tmp_path / "b", no_bpb(tokenizer=OTHER))
    doc = compare_runs([a, b], "steps")
    assert doc["metric"] == "loss"
    assert {(s["run"], s["kind"]) for s in doc["series"]} >= {(str(a), "train"), (str(b), "train")}
    assert "eval sets" in doc["note"] and "does not compare across tokenizers" in doc["note"]
    result = runner.invoke(app, ["runs", "compare", str(a), str(b)])
    assert result.exit_code == 0, result.output
    assert "logged no losses" not in result.stdout
    assert "train loss against tokens" in result.stdout and "note: " in result.stdout


def test_a_run_without_bits_per_byte_among_others_is_named(tmp_path):
    a = write_summary(tmp_path / "a", summary())
    b = write_summary(tmp_path / "b", no_bpb(tokenizer=OTHER))
    doc = compare_runs([a, b], "tokens")
    assert doc["metric"] == "bits_per_byte" and {s["run"] for s in doc["series"]} == {str(a)}
    assert doc["warnings"] == [f"{b}: no bits per byte (score eval sets with eval.sets)"]


def test_36_runs_are_drawn_and_more_than_the_marks_refused_in_one_line(tmp_path):
    paths = [
        str(write_summary(tmp_path / f"r{i:02d}", summary(final_train_loss=3.0 + i / 100)))
        for i in range(len(MARKS) + 1)
    ]
    result = runner.invoke(app, ["runs", "compare", *paths[:36]])
    assert result.exit_code == 0, result.output
    assert f"{MARKS[35]} = {paths[35]} (completed)" in result.stdout
    refused = runner.invoke(app, ["runs", "compare", *paths])
    assert refused.exit_code == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert f"at most {len(MARKS)} runs at once (got {len(paths)})" in refused.stderr


def jsonl(run: Path, steps: int) -> None:
    lines = [
        {
            "event": "train_step",
            "step": s,
            "tokens": 128 * s,
            "loss": 5 - s / 1000,
            "steps_per_s": 1,
        }
        for s in range(1, steps + 1)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_every_logged_point_is_drawn_and_the_json_stays_short(tmp_path):
    config = {"logging": {"json_file": "metrics.jsonl"}, "model": {"vocab_size": 256}}
    a = write_summary(tmp_path / "a", summary(config=config))
    jsonl(a, 1000)
    b = write_summary(tmp_path / "b", summary())
    doc = compare_runs([a, b], "steps")
    train = {s["run"]: s["points"] for s in doc["series"] if s["kind"] == "train"}
    assert len(train[str(a)]) == 1000 and train[str(a)][-1] == [1000, 4.0]
    assert len(train[str(b)]) == 3  # no log of its own: its summary's curve
    result = runner.invoke(app, ["runs", "compare", str(a), str(b), "--format", "json"])
    shown = json.loads(result.stdout)["series"]
    assert max(len(s["points"]) for s in shown) == 256


def test_smoothing_is_a_debiased_exponential_moving_average():
    assert smooth([4.0, 2.0, 3.0], 0.0) == [4.0, 2.0, 3.0]
    assert smooth([3.0] * 5, 0.9) == pytest.approx([3.0] * 5)  # no pull towards zero
    got = smooth([4.0, 2.0], 0.5)
    assert got[0] == 4.0 and got[1] == pytest.approx((0.5 * 0.5 * 4 + 0.5 * 2) / 0.75)


def test_plot_options_are_checked_in_one_line(tmp_path):
    a = write_summary(tmp_path / "a", summary())
    b = write_summary(tmp_path / "b", summary())
    for extra, words in (
        (["--smooth", "0.5"], "only with --plot"),
        (["--plot", str(tmp_path / "c.png"), "--smooth", "1.5"], "--smooth: must be"),
    ):
        result = runner.invoke(app, ["runs", "compare", str(a), str(b), *extra])
        assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
        assert words in result.stderr


def test_a_plot_with_nothing_to_draw_is_refused_in_one_line(tmp_path):
    a = write_summary(tmp_path / "a", summary(curve={"train": [], "eval": []}))
    b = write_summary(tmp_path / "b", summary(curve={"train": [], "eval": []}))
    picture = tmp_path / "c.png"
    result = runner.invoke(app, ["runs", "compare", str(a), str(b), "--plot", str(picture)])
    assert result.exit_code == 2 and not picture.exists()
    assert f"nothing to draw into {picture}" in result.stderr.splitlines()[-1]
    assert result.stderr.count("no curve: it logged no losses") == 2


def fleet(tmp_path: Path) -> list[Path]:
    """A master (coordinating: its final global only) and two workers of one fleet, and a
    run on one machine."""
    node = {"enabled": True, "repo_id": "/data/repo"}
    runs = []
    for name, role in (("w1", "worker"), ("w2", "worker")):
        config = {"distributed": {**node, "role": role, "node_id": name}}
        runs.append(write_summary(tmp_path / name, summary(config=config, role=role, node_id=name)))
    master = tmp_path / "m"
    (master / "final_global").mkdir(parents=True)
    (master / "diloco_master").mkdir()
    meta = {"step": 3, "tokens": 25600, "optimizer_steps": 200, "loss": None, "diloco": {}}
    meta["config"] = {"distributed": {**node, "role": "master", "node_id": "m"}}
    (master / "final_global" / "meta.json").write_text(json.dumps(meta))
    solo = write_summary(tmp_path / "solo", summary())
    return [*runs, master, solo]


def test_a_fleets_nodes_and_final_global_are_told_apart(tmp_path):
    paths = fleet(tmp_path)
    doc = compare_runs(paths, "tokens")
    assert [r["fleet"] for r in doc["runs"]] == ["/data/repo", "/data/repo", None, None]
    [final] = doc["finals"]
    assert (final["outer_step"], final["x"], final["loss"]) == (3, 25600, None)
    assert compare_runs(paths, "time")["finals"][0]["x"] is None  # no training seconds


def test_the_picture_is_log_x_smoothed_with_the_fleet_apart(tmp_path):
    pytest.importorskip("matplotlib")
    from speedtronic.results.plot import PlotOptions, draw

    doc = compare_runs(fleet(tmp_path), "tokens")
    figure = draw(doc, PlotOptions(smooth=0.6, log_y=True))
    [ax] = figure.axes[:1]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    labels = [line.get_label() for line in ax.get_lines()]
    assert any("worker w1" in label for label in labels)
    assert any("final global" in label and "outer step 3" in label for label in labels)
    styles = {line.get_label(): line.get_linestyle() for line in ax.get_lines()}
    node = next(k for k in styles if k.endswith("(worker w1)") and not k.startswith("_"))
    solo = next(k for k in styles if k.startswith(str(tmp_path / "solo")))
    assert styles[node] != styles[solo]  # a fleet node is dashed, a lone run solid
    raw = [line for line in ax.get_lines() if line.get_label().startswith("_raw")]
    assert raw  # smoothed: the logged points stay, faint
    linear = draw(doc, PlotOptions(log_x=False))
    assert linear.axes[0].get_xscale() == "linear"

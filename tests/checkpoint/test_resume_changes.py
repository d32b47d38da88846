"""Issue 31, item 4: ``--resume`` with a config that differs from the checkpoint's, and
``--init-from``.

A new ``optimizer.lr`` was not applied while meta.json recorded it; a new data file was taken
silently; a longer ``max_steps`` re-stretched the cosine so the LR jumped back up (3e-4 to about
1.9e-3). Now each difference is named, applied or refused with the way to do it, the schedule
keeps its horizon, meta.json records only what was applied, and ``--init-from`` starts a new
run from a checkpoint's weights.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from speedtronic.checkpoint.layout import list_step_dirs, read_latest
from speedtronic.checkpoint.load import load_checkpoint
from speedtronic.cli.app import app
from speedtronic.errors import ConfigError
from speedtronic.runtime import train_from_config

runner = CliRunner()


def run(config, **changes):
    """Train ``config`` with ``section.key`` changes; the events it logged."""
    config = json.loads(json.dumps(config))
    for key, value in changes.items():
        section, name = key.split("__")
        config.setdefault(section, {})[name] = value
    events: list[tuple[str, dict]] = []
    result = train_from_config(config, console=False, hooks=[lambda e, p: events.append((e, p))])
    return result, events


def lrs(events) -> dict[int, float]:
    return {p["step"]: p["lr"] for e, p in events if e == "train_step"}


def notices(events) -> list[str]:
    return [p["message"] for e, p in events if e == "notice"]


def meta(tiny, step: int) -> dict:
    path = f"{tiny['run']['output_dir']}/checkpoints/step_{step:010d}/meta.json"
    with open(path) as f:
        return json.load(f)


@pytest.fixture
def cosine(tiny):
    tiny["logging"]["every_steps"] = 1
    tiny["scheduler"] = {"name": "cosine", "warmup_steps": 2, "min_lr_ratio": 0.1}
    return tiny


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One finished 6-step run, copied by each test that only resumes it (trained once)."""
    from conftest import TINY

    config = json.loads(json.dumps(TINY))
    config["run"]["output_dir"] = str(tmp_path_factory.mktemp("trained") / "run")
    config["checkpoint"] = {"directory": config["run"]["output_dir"] + "/checkpoints"}
    run(config)
    return Path(config["run"]["output_dir"])


def test_a_new_lr_is_applied_on_resume_and_recorded_only_because_it_was(cosine):
    run(cosine)  # 6 steps at lr 1e-2
    _, events = run(cosine, run__max_steps=6, optimizer__lr=1e-3, checkpoint__resume=True)
    assert "--resume: optimizer.lr: 0.01 -> 0.001, applied from step 7" in notices(events)
    _, events = run(cosine, run__max_steps=8, optimizer__lr=1e-3, checkpoint__resume=True)
    assert lrs(events)[7] == pytest.approx(1e-3 * 0.1)  # the new peak, at the schedule's end
    assert meta(cosine, 8)["config"]["optimizer"]["lr"] == 1e-3
    state = load_checkpoint(f"{cosine['run']['output_dir']}/checkpoints/step_0000000008")
    groups = state.trainer_state["optimizer"]["param_groups"]
    assert all(g["initial_lr"] == 1e-3 for g in groups)  # what ran is what was recorded


def test_a_longer_max_steps_keeps_the_schedule_continuous(cosine):
    """The horizon stays the original total: the LR never jumps back up, and the extension
    trains at the schedule's final LR (min_lr_ratio * lr)."""
    _, first = run(cosine)
    _, events = run(cosine, run__max_steps=12, checkpoint__resume=True)
    before, after = lrs(first), lrs(events)
    assert max(after.values()) <= before[6] + 1e-12
    assert all(lr == pytest.approx(1e-2 * 0.1) for lr in after.values())
    line = next(n for n in notices(events) if "run.max_steps" in n)
    assert "6 -> 12, applied; the LR schedule keeps its horizon of 6 steps" in line
    assert "steps 7-12 train at its final LR 1.00e-03" in line
    recorded = meta(cosine, 12)["config"]
    assert recorded["run"]["max_steps"] == 12 and recorded["scheduler"]["total_steps"] == 6


def test_a_run_extended_before_its_end_follows_the_original_curve_bit_for_bit(cosine):
    """Stopped at 3 of 6 and resumed to 10: steps 4-6 have exactly the LRs of the straight run."""
    _, straight = run(cosine)
    cosine["run"]["output_dir"] += "-split"
    run(cosine, run__max_steps=3, scheduler__total_steps=6)
    _, resumed = run(cosine, run__max_steps=10, checkpoint__resume=True)
    for step in (4, 5, 6):
        assert lrs(resumed)[step] == lrs(straight)[step]
    assert lrs(resumed)[10] == pytest.approx(1e-3)


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("data__text_path", "other.txt", "the saved data position indexes the data"),
        ("data__micro_batch_size", 2, "batches of the run's layout"),
        ("data__seed", 7, "data order"),
        ("scheduler__warmup_steps", 3, "the LR schedule is the run's own"),
        ("scheduler__total_steps", 20, "the LR schedule is the run's own"),
        ("run__seed", 1, "initial weights"),
    ],
)
def test_what_the_saved_state_depends_on_is_refused_with_the_way_to_do_it(
    tiny, trained, tmp_path, key, value, why
):
    shutil.copytree(trained, tmp_path / "run")
    root = tmp_path / "run" / "checkpoints"
    tiny["checkpoint"] = {"directory": str(root)}
    before = {p: hashlib.sha256(p.read_bytes()).digest() for p in root.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError) as caught:
        run(tiny, checkpoint__resume=True, **{key: value})
    dotted = key.replace("__", ".")
    assert f"--resume: {dotted}: " in str(caught.value) and "cannot change within a run" in str(
        caught.value
    )
    assert why in str(caught.value)
    assert "--init-from" in caught.value.hint and "meta.json" in caught.value.hint
    after = {p: hashlib.sha256(p.read_bytes()).digest() for p in root.rglob("*") if p.is_file()}
    assert after == before  # refused before anything was written


def test_applied_changes_are_each_named_and_take_effect(cosine):
    run(cosine)
    _, events = run(
        cosine,
        run__max_steps=8,
        logging__every_steps=2,
        optimizer__weight_decay=0.0,
        optimizer__grad_clip=0.5,
        checkpoint__resume=True,
    )
    said = notices(events)
    for line in (
        "--resume: logging.every_steps: 1 -> 2, applied from step 7",
        "--resume: optimizer.weight_decay: 0.1 -> 0.0, applied from step 7",
        "--resume: optimizer.grad_clip: 1.0 -> 0.5, applied from step 7",
    ):
        assert line in said, said
    assert sorted(lrs(events)) == [8]  # logged every 2 steps now (and at the last)


def test_an_unchanged_resume_names_no_change(cosine):
    run(cosine)
    _, events = run(cosine, checkpoint__resume=True)
    assert not [n for n in notices(events) if n.startswith("--resume")], notices(events)


def test_the_cli_lists_a_refused_data_change_and_exits_2(tiny, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny))
    assert runner.invoke(app, ["train", "-c", str(config)]).exit_code == 0
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("text " * 500)
    result = runner.invoke(
        app,
        ["train", "-c", str(config), "--resume", "--set", f"data.text_path={corpus}"],
    )
    assert result.exit_code == 2, result.output
    error, hint = result.stderr.strip().splitlines()
    assert error.startswith("speedtronic: error: --resume: data.text_path: null -> ")
    assert f"--init-from {tmp_path / 'run'} --output-dir NEW_DIR" in hint


# ---- --init-from ----------------------------------------------------------------------------


def test_init_from_starts_a_new_run_from_the_weights_only(cosine, tmp_path):
    first, first_events = run(cosine)
    source = load_checkpoint(first.checkpoint)
    fresh = {**cosine, "run": {**cosine["run"], "output_dir": str(tmp_path / "tuned")}}
    fresh["checkpoint"] = {"init_from": str(tmp_path / "run")}
    from speedtronic.runtime import build_runtime

    runtime = build_runtime(fresh, console=False)
    for name, tensor in runtime.model.state_dict().items():
        assert torch.equal(tensor, source.model_state[name]), name
    assert runtime.trainer.step == 0 and not runtime.optimizer.state  # a fresh optimizer
    runtime.logger.close()
    result, events = run(fresh)
    assert lrs(events) == lrs(first_events)  # the schedule starts again, warmup included
    assert result.steps == 6
    init_meta = json.loads((tmp_path / "tuned/checkpoints/step_0000000006/meta.json").read_text())
    assert init_meta["run_id"] != meta(cosine, 6)["run_id"]
    said = notices(events)
    assert any(n.startswith("checkpoint.init_from: the weights of ") for n in said), said


def test_init_from_a_model_of_another_shape_is_one_line_naming_the_tensor(tiny, tmp_path):
    run(tiny)
    config = tmp_path / "c.yaml"
    wider = {**tiny, "run": {**tiny["run"], "output_dir": str(tmp_path / "wide")}}
    wider["model"] = {**tiny["model"], "d_model": 64}
    config.write_text(yaml.safe_dump(wider))
    result = runner.invoke(app, ["train", "-c", str(config), "--init-from", str(tmp_path / "run")])
    assert result.exit_code == 2
    error = result.stderr.splitlines()[0]
    assert error.startswith("speedtronic: error: checkpoint.init_from: ")
    assert "does not fit this model: " in error and "tok_emb.weight is [64, 32] there" in error
    assert not (tmp_path / "wide" / "checkpoints").exists()


def test_init_from_with_resume_continues_the_new_runs_own_checkpoint(cosine, tmp_path):
    run(cosine)
    tuned = {**cosine, "run": {**cosine["run"], "output_dir": str(tmp_path / "tuned")}}
    tuned["checkpoint"] = {"init_from": str(tmp_path / "run")}
    run(tuned, run__max_steps=3)
    (tmp_path / "run" / "checkpoints" / "latest.json").unlink()  # the source may be gone
    for path in list_step_dirs(tmp_path / "run" / "checkpoints"):
        for file in path.iterdir():
            file.unlink()
        path.rmdir()
    result, events = run(tuned, checkpoint__resume=True)
    assert result.steps == 6 and read_latest(tmp_path / "tuned" / "checkpoints")
    assert any("init_from: not used" in n for n in notices(events))
    assert math.isfinite(result.final_loss)

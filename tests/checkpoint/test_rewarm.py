"""Issue 40, item 4: ``--resume --rewarm N`` starts a new LR schedule from the saved state.

``--resume --set optimizer.lr=1e-3`` after the schedule ended trained at the schedule's final
LR (the asked value is a peak), and a new schedule needed ``--init-from``, which drops the
optimizer's moments. A re-warm warms up from the resumed step to the (new) peak and decays to
the new ``run.max_steps``, keeping the optimizer state, data position and random streams.
"""

from __future__ import annotations

import json
import math

import pytest
import yaml
from typer.testing import CliRunner

from speedtronic.checkpoint.load import load_checkpoint
from speedtronic.cli.app import app
from speedtronic.config import SchedulerConfig
from speedtronic.optim.build import lr_factor
from speedtronic.runtime import train_from_config

runner = CliRunner()
PEAK, FLOOR = 2e-2, 0.1


def run(config, **changes):
    """Train ``config`` with ``section__key`` changes; the events it logged."""
    config = json.loads(json.dumps(config))
    for key, value in changes.items():
        section, name = key.split("__")
        config.setdefault(section, {})[name] = value
    events: list[tuple[str, dict]] = []
    train_from_config(config, console=False, hooks=[lambda e, p: events.append((e, p))])
    return events


def lrs(events) -> dict[int, float]:
    return {p["step"]: p["lr"] for e, p in events if e == "train_step"}


def notices(events) -> list[str]:
    return [p["message"] for e, p in events if e == "notice"]


def step_dir(config, step: int) -> str:
    return f"{config['run']['output_dir']}/checkpoints/step_{step:010d}"


@pytest.fixture
def finished(tiny):
    """A 6-step cosine run at lr 1e-2 that has ended (its LR at its floor, 1e-3)."""
    tiny["logging"]["every_steps"] = 1
    tiny["scheduler"] = {"name": "cosine", "warmup_steps": 2, "min_lr_ratio": FLOOR}
    run(tiny)
    return tiny


def rewarmed_lr(index: int, begun: int = 6, warmup: int = 2, end: int = 12) -> float:
    """The LR of optimizer step ``index`` (0-based) under a fresh cosine schedule of
    ``end - begun`` steps from ``begun``. A train_step event for step N (1-based) logs the LR
    in force after it: index N."""
    k = index - begun
    if k < warmup:
        return PEAK * (k + 1) / warmup
    progress = min(1.0, (k - warmup) / (end - begun - warmup))
    return PEAK * (FLOOR + (1 - FLOOR) * 0.5 * (1 + math.cos(math.pi * progress)))


def test_a_rewarm_warms_up_to_the_new_peak_then_decays_to_the_new_end(finished):
    events = run(
        finished,
        run__max_steps=12,
        optimizer__lr=PEAK,
        scheduler__rewarm_steps=2,
        checkpoint__resume=True,
    )
    got = lrs(events)
    assert sorted(got) == list(range(7, 13))
    for step in range(7, 13):
        assert got[step] == pytest.approx(rewarmed_lr(step), rel=1e-9), step
    assert got[7] == pytest.approx(PEAK)  # the asked value is reached, not the old floor
    assert (
        "--resume: re-warming to lr 2.00e-02 over 2 steps (steps 7-8), then cosine to lr "
        "2.00e-03 at step 12 (scheduler.rewarm_steps)" in "\n".join(notices(events))
    )
    recorded = json.load(open(f"{step_dir(finished, 12)}/meta.json"))["config"]["scheduler"]
    assert recorded["rewarm_steps"] == 2 and recorded["rewarm_from"] == 6
    factor = lr_factor(SchedulerConfig(**recorded), 12)  # step 7's LR, logged by no event
    assert factor(6) * PEAK == pytest.approx(rewarmed_lr(6)) == pytest.approx(PEAK / 2)


def test_a_rewarm_keeps_the_optimizer_state_and_counters(finished):
    before = load_checkpoint(step_dir(finished, 6)).trainer_state
    run(finished, run__max_steps=8, scheduler__rewarm_steps=1, checkpoint__resume=True)
    after = load_checkpoint(step_dir(finished, 8)).trainer_state
    steps = {float(s["step"]) for s in after["optimizer"]["state"].values()}
    assert steps == {8.0}  # AdamW's bias correction counts on: the moments were not reset
    moments = [s["exp_avg_sq"] for s in after["optimizer"]["state"].values()]
    assert all(float(m.abs().sum()) > 0 for m in moments)
    assert after["step"] == 8 and after["tokens"] == before["tokens"] * 8 // 6
    assert after["data"] != before["data"]  # the data position went on from the checkpoint's


def test_a_stopped_rewarm_goes_on_with_its_own_curve(finished):
    """Resumed again, plainly or with the same command, the re-warm is not started anew."""
    same = dict(optimizer__lr=PEAK, scheduler__rewarm_steps=2, checkpoint__resume=True)
    run(finished, run__max_steps=9, scheduler__total_steps=12, **same)
    again = run(finished, run__max_steps=10, scheduler__total_steps=12, **same)
    assert any("the re-warm begun at step 6 goes on: re-warming" in n for n in notices(again))
    plain = run(finished, run__max_steps=12, optimizer__lr=PEAK, checkpoint__resume=True)
    got = {**lrs(again), **lrs(plain)}
    for step in range(10, 13):
        assert got[step] == pytest.approx(rewarmed_lr(step), rel=1e-9), step


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--rewarm", "2"], "scheduler.rewarm_steps: needs checkpoint.resume: true (--resume)"),
        (["--resume", "--rewarm", "-1"], "scheduler.rewarm_steps: must be in [0, 2**40]"),
        (
            ["--resume", "--rewarm", "6", "--max-steps", "12"],
            "scheduler.rewarm_steps: must be less than the 6 steps left after the "
            "checkpoint's step 6 (run.max_steps 12) (got 6)",
        ),
    ],
)
def test_a_bad_rewarm_is_one_line_naming_the_key(finished, tmp_path, args, error):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(finished))
    result = runner.invoke(app, ["train", "-c", str(config), *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[0].startswith(f"speedtronic: error: {error}")
    assert "Traceback" not in result.output
    if "steps left" in error:  # not the hint of a refused key (--init-from)
        assert result.stderr.splitlines()[1] == (
            "hint: re-warm over fewer steps, or extend the run: a larger run.max_steps "
            "(--max-steps)"
        )


def test_a_rewarm_with_no_checkpoint_is_refused_not_dropped(tiny, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny))
    result = runner.invoke(app, ["train", "-c", str(config), "--resume", "--rewarm", "2"])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("speedtronic: error: scheduler.rewarm_steps: no checkpoint in")

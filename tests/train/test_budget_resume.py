"""``--resume`` of a time-budgeted run (issue 53, item 3): the budget is the run's end, so a
resume that sets none keeps the checkpoint's; a new end (another budget, or steps instead) never
sends the learning rate back up: the decay goes on from the LR the run had reached.

The clock reads a fake time (``test_time_budget.FakeTime``): nothing depends on the machine.
"""

from __future__ import annotations

import json

import pytest

from speedtronic.runtime import train_from_config
from speedtronic.train import clock as run_clock
from tests.train.test_time_budget import BUDGET_S, STEP_S, FakeTime, tmp_output

LR, FLOOR = 1e-2, 0.1


class Rates(FakeTime):
    """FakeTime that records, after each step, the LR the next step trains at."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.rates: list[float] = []

    def after_optimizer_step(self, trainer) -> None:
        self.rates.append(trainer.optimizer.param_groups[0]["lr"])
        super().after_optimizer_step(trainer)


def run(tiny, monkeypatch, fake: Rates, **values) -> tuple[object, dict]:
    for key, value in values.items():
        section, name = key.split(".")
        tiny.setdefault(section, {})[name] = value
    monkeypatch.setattr(run_clock, "now", fake.now)
    result = train_from_config(tiny, console=False, plugins=[fake])
    return result, json.loads((tmp_output(tiny) / "summary.json").read_text())


@pytest.fixture
def budgeted(tiny):
    tiny["optimizer"]["name"] = "adamw"
    tiny["scheduler"] = {"warmup_steps": 2, "min_lr_ratio": FLOOR}
    tiny["run"].update(max_steps=2**40, time_budget_s=BUDGET_S)
    return tiny


def resumed(tiny, **run_values):
    """The config of a resume: the budget's flags gone unless given again (as on the CLI)."""
    tiny["run"].pop("time_budget_s")
    tiny["run"].update({"max_steps": 150, **run_values})
    tiny["checkpoint"] = {"resume": True}
    return tiny


def test_a_resume_without_a_budget_keeps_the_checkpoints(budgeted, monkeypatch):
    first = Rates(stop_at=4)
    result, _ = run(budgeted, monkeypatch, first)
    assert result.status == "interrupted"
    second = Rates()
    _, summary = run(resumed(budgeted), monkeypatch, second)
    assert summary["stop_reason"] == "time_budget" and summary["time_budget_s"] == BUDGET_S
    assert BUDGET_S <= summary["train_s"] < BUDGET_S + STEP_S
    assert summary["config"]["run"]["max_steps"] == 2**40  # the budget's, not the config's 150
    rates = first.rates + second.rates
    assert rates[1:] == sorted(rates[1:], reverse=True)  # after warmup: only down
    assert max(second.rates) <= first.rates[-1]


def test_ending_by_steps_instead_decays_on_from_the_lr_reached(budgeted, monkeypatch):
    """--resume --max-steps N after a spent budget: the old code trained at the peak LR."""
    first = Rates()
    _, done = run(budgeted, monkeypatch, first)
    assert done["stop_reason"] == "time_budget"
    end = done["steps"] + 6
    second = Rates()
    resumed(budgeted, max_steps=end)["checkpoint"]["keep_budget"] = False
    result, summary = run(budgeted, monkeypatch, second)
    assert summary["steps"] == end == result.steps and summary["time_budget_s"] is None
    assert len(second.rates) == 6
    assert second.rates == sorted(second.rates, reverse=True)
    assert second.rates[0] <= first.rates[-1]
    assert second.rates[-1] == pytest.approx(LR * FLOOR)  # at the new end: the floor


def test_a_larger_budget_on_resume_never_raises_the_lr(budgeted, monkeypatch):
    first = Rates()
    _, done = run(budgeted, monkeypatch, first)
    second = Rates()
    _, summary = run(resumed(budgeted, time_budget_s=2 * BUDGET_S), monkeypatch, second)
    assert summary["stop_reason"] == "time_budget" and summary["steps"] > done["steps"] + 4
    assert second.rates == sorted(second.rates, reverse=True)
    assert second.rates[0] <= first.rates[-1]
    assert second.rates[-1] == pytest.approx(LR * FLOOR, rel=0.05)


@pytest.mark.parametrize(
    ("args", "keep"),
    [(["--resume"], True), (["--resume", "--max-steps", "9"], False),
     (["--resume", "--set", "run.max_steps=9"], False),
     (["--resume", "--time-budget", "5s"], True), (["--max-steps", "9"], True)],
)  # fmt: skip
def test_max_steps_on_a_resume_ends_a_budgeted_run_by_steps(args, keep, tmp_path):
    """On the command line, --max-steps (or --set max_steps) is what drops a kept budget."""
    from typer.testing import CliRunner

    from speedtronic.cli.app import app

    result = CliRunner().invoke(app, ["validate", "--output-dir", str(tmp_path), *args])
    assert result.exit_code == 0, result.output
    assert f"keep_budget: {str(keep).lower()}" in result.stdout


@pytest.mark.parametrize("name", ["cosine", "wsd", "constant"])
@pytest.mark.parametrize("top", [1.0, 0.4])
def test_a_continued_schedule_starts_where_it_stood_and_only_falls(name, top):
    from speedtronic.config import SchedulerConfig
    from speedtronic.optim.build import progress_factor

    top = 1.0 if name == "constant" else top
    cfg = SchedulerConfig(name=name, warmup_steps=2, min_lr_ratio=FLOOR)
    cfg.continue_factor, cfg.continue_progress = top, 0.3  # at step 30 of a new 100-step end
    factor = progress_factor(cfg, 100, lambda: 0.0)
    values = [factor(step) for step in range(30, 101)]
    assert values[0] == pytest.approx(top)
    assert values == sorted(values, reverse=True)
    assert values[-1] == pytest.approx(1.0 if name == "constant" else FLOOR)

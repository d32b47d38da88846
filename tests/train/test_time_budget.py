"""``run.time_budget_s`` / ``--time-budget``: the run trains for its budget of training seconds
(start-up apart), ends as a completed run, and a resumed run continues the same budget.

The clock reads a fake time that a plug-in advances by a fixed amount per step (and once, a
lot, before the first step: a slow start-up), so nothing here depends on the machine's speed.
"""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest

from speedtronic.config import SpeedtronicConfig
from speedtronic.errors import ConfigError
from speedtronic.runtime import train_from_config
from speedtronic.train import clock as run_clock

STEP_S = 0.25  # fake seconds per optimizer step
BUDGET_S = 2.0


class FakeTime:
    """The clock's time source, and a plug-in that moves it: ``startup_s`` before the first
    step, ``STEP_S`` after each; ``stop_at``: a SIGTERM-like stop after that step."""

    def __init__(self, startup_s: float = 0.0, stop_at: int | None = None):
        self.t, self.startup_s, self.stop_at = 1000.0, startup_s, stop_at

    def now(self) -> float:
        return self.t

    def on_train_start(self, trainer) -> None:
        self.t += self.startup_s

    def after_optimizer_step(self, trainer) -> None:
        self.t += STEP_S
        if trainer.step == self.stop_at:
            trainer.request_stop(signal.SIGTERM)


def budgeted_run(tiny, monkeypatch, fake: FakeTime, **run):
    tiny["run"].update(max_steps=1000, time_budget_s=BUDGET_S, **run)
    monkeypatch.setattr(run_clock, "now", fake.now)
    result = train_from_config(tiny, console=False, plugins=[fake])
    summary = json.loads((tmp_output(tiny) / "summary.json").read_text())
    return result, summary


def tmp_output(tiny) -> Path:
    return Path(tiny["run"]["output_dir"])


def test_a_budgeted_run_stops_within_one_step_of_its_budget(tiny, monkeypatch):
    result, summary = budgeted_run(tiny, monkeypatch, FakeTime())
    assert result.status == "completed"
    assert summary["status"] == "completed" and summary["stop_reason"] == "time_budget"
    assert BUDGET_S <= summary["train_s"] < BUDGET_S + STEP_S
    # the first step is start-up (compile warm-up): the clock runs from its end
    assert summary["steps"] == round(BUDGET_S / STEP_S) + 1 == result.steps
    assert (tmp_output(tiny) / "checkpoints" / "step_0000000009").is_dir()


def test_the_budget_excludes_a_slow_start_up(tiny, monkeypatch):
    _, summary = budgeted_run(tiny, monkeypatch, FakeTime(startup_s=600.0))
    assert summary["stop_reason"] == "time_budget" and summary["steps"] == 9
    assert summary["startup_s"] >= 600.0
    assert BUDGET_S <= summary["train_s"] < BUDGET_S + STEP_S


def test_resume_continues_the_same_budget(tiny, monkeypatch):
    result, first = budgeted_run(tiny, monkeypatch, FakeTime(stop_at=4))
    assert result.status == "interrupted" and first["status"] == "stopped"
    assert first["stop_reason"] == "signal" and first["train_s"] == 3 * STEP_S
    tiny["checkpoint"] = {"resume": True}
    result, second = budgeted_run(tiny, monkeypatch, FakeTime())
    assert second["stop_reason"] == "time_budget"
    assert BUDGET_S <= second["train_s"] < BUDGET_S + STEP_S  # both parts together
    assert second["started_at"] == first["started_at"]
    assert [p[0] for p in second["curve"]["train"]][:3] == [1, 2, 4]  # part 1's points kept


def test_a_resumed_run_whose_budget_is_spent_trains_no_more(tiny, monkeypatch):
    _, first = budgeted_run(tiny, monkeypatch, FakeTime())
    tiny["checkpoint"] = {"resume": True}
    result, again = budgeted_run(tiny, monkeypatch, FakeTime())
    assert result.status == "at_target" and again["steps"] == first["steps"]
    assert again["train_s"] == first["train_s"]


def test_the_schedule_follows_the_budget(tiny, monkeypatch):
    """Warmup over its steps, then the cosine decays with the seconds spent, not the steps."""

    class Rates(FakeTime):
        def after_optimizer_step(self, trainer) -> None:
            rates.append(trainer.optimizer.param_groups[0]["lr"])  # the next step's
            super().after_optimizer_step(trainer)

    rates: list[float] = []
    tiny["optimizer"]["name"] = "adamw"
    tiny["scheduler"] = {"warmup_steps": 2, "min_lr_ratio": 0.1}
    budgeted_run(tiny, monkeypatch, Rates())
    lr = tiny["optimizer"]["lr"]
    assert rates[0] == pytest.approx(lr)  # after step 1: warmed up (2 steps), no time spent
    assert rates == sorted(rates, reverse=True)
    # step 9's rate was set when step 8 had measured 7 steps' seconds: 7/8 of the budget
    spent = 7 * STEP_S / BUDGET_S
    assert rates[-1] == pytest.approx(lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * spent))))


@pytest.mark.parametrize(
    ("value", "rule"),
    [(-1, "must be > 0 or null (got -1.0)"), (0, "must be > 0 or null (got 0.0)"),
     ("5m", "must be a number or null (got the string '5m')")],
)  # fmt: skip
def test_time_budget_s_is_validated_in_one_line(tiny, value, rule):
    tiny["run"]["time_budget_s"] = value
    with pytest.raises(ConfigError) as caught:
        SpeedtronicConfig.from_dict(tiny)
    assert str(caught.value) == f"run.time_budget_s: {rule}"


class Events:
    def __init__(self):
        self.seen: list[tuple[str, dict]] = []

    def on_event(self, event, payload) -> None:
        self.seen.append((event, payload))

    def warnings(self) -> list[str]:
        return [p["message"] for e, p in self.seen if e == "warning"]


def test_a_budget_that_ends_inside_warmup_says_so(tiny, monkeypatch):
    """Issue 53: docs/runs.md's 60 s example ended inside its 10-step warmup with no word."""
    events = Events()
    tiny["scheduler"] = {"warmup_steps": 20}
    tiny["run"].update(max_steps=1000, time_budget_s=BUDGET_S)
    fake = FakeTime()
    monkeypatch.setattr(run_clock, "now", fake.now)
    train_from_config(tiny, console=False, plugins=[fake], hooks=[events])
    said = [w for w in events.warnings() if w.startswith("run.time_budget_s")]
    assert len(said) == 1 and "step 9" in said[0]
    assert "inside the LR warmup (scheduler.warmup_steps 20)" in said[0]


def test_a_budget_that_ends_before_the_first_evaluation_says_so(tiny, tmp_path, monkeypatch):
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    tiny["data"].update(text_path=str(text), eval_fraction=0.2, eval_every=50)
    tiny["model"]["vocab_size"] = 256
    events, fake = Events(), FakeTime()
    tiny["run"].update(max_steps=1000, time_budget_s=BUDGET_S)
    monkeypatch.setattr(run_clock, "now", fake.now)
    train_from_config(tiny, console=False, plugins=[fake], hooks=[events])
    said = [w for w in events.warnings() if w.startswith("run.time_budget_s")]
    assert len(said) == 1 and "before the first evaluation (data.eval_every 50)" in said[0]
    assert "warmup" not in said[0]  # 2 warmup steps: long past

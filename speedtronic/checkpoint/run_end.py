"""What ``--resume`` does with a time-budgeted run's end (issue 53). Stdlib only.

``--time-budget`` is a flag of the command that started a run, so the command that resumes it
usually says nothing about the end: a config that sets no ``run.time_budget_s`` keeps the
checkpoint's budget and its ``run.max_steps`` (``checkpoint.keep_budget``, the default), and the
same run goes on to the same end. Another end is asked for with ``--time-budget`` (a new budget)
or ``--max-steps`` (``checkpoint.keep_budget: false``: steps instead of the budget).

A new end moves the schedule's horizon, and reading the schedule at the resumed step under the
new horizon makes the LR jump: a budget dropped for steps read progress 0 of a 2**40-step
horizon, the peak LR at every step after it had decayed. So the decay goes on from where it
stands: ``scheduler.continue_factor`` records the LR factor at the resumed step and
``continue_progress`` the new end's progress there; from there the factor decays per
``scheduler.name`` to ``min_lr_ratio`` at the new end (``optim.build``). Both are recorded in
the config (meta.json), so a later plain resume follows the same curve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from speedtronic.config import SpeedtronicConfig

KEYS = ("scheduler.continue_factor", "scheduler.continue_progress")
KEEP = "checkpoint.keep_budget"  # how this command was started: never compared


def involved(saved: dict[str, Any], config: SpeedtronicConfig) -> bool:
    """A time budget in the checkpoint's run or in this config: its end is settled here."""
    return bool((saved.get("run") or {}).get("time_budget_s") or config.run.time_budget_s)


def carry(saved: dict[str, Any], config: SpeedtronicConfig) -> SpeedtronicConfig:
    """The recorded continuation goes on (a plain resume after a change of end)."""
    sched = saved.get("scheduler") or {}
    factor, progress = sched.get("continue_factor"), sched.get("continue_progress")
    if config.scheduler.continue_factor is not None or not _numbers(factor, progress):
        return config
    return _with(config, {"scheduler": {"continue_factor": factor, "continue_progress": progress}})


def settle(
    saved: dict[str, Any],
    config: SpeedtronicConfig,
    step: int,
    seconds: float,
    lr_factor: float | None,
) -> tuple[SpeedtronicConfig, list[str], str | None]:
    """The config to resume with (the budget kept, or the schedule continued), its notices, or
    why the new end cannot be. ``seconds``: training seconds at the checkpoint's ``step``;
    ``lr_factor``: its LR as a share of the base LR (None where its scheduler saved none)."""
    run, sched = saved.get("run") or {}, saved.get("scheduler") or {}
    budget, cap = run.get("time_budget_s"), run.get("max_steps")
    horizon = sched.get("total_steps") or cap
    notes = []
    if budget and config.run.time_budget_s is None and config.checkpoint.keep_budget:
        config = _with(config, {"run": {"time_budget_s": budget, "max_steps": cap}})
        notes.append(_kept_words(budget, seconds))
    asked = config.scheduler.total_steps
    if asked is not None and asked != horizon:
        problem = (
            f"--resume: scheduler.total_steps: {horizon} -> {asked} cannot change within a "
            "run: the LR schedule is the run's own: another one would make the LR jump"
        )
        return config, [], problem
    new_budget = config.run.time_budget_s
    if new_budget == budget and config.schedule_steps == horizon:
        return config, notes, None
    at = max(seconds / new_budget if new_budget else 0.0, step / config.schedule_steps)
    floor = config.scheduler.min_lr_ratio
    factor = 1.0 if step < config.scheduler.warmup_steps else lr_factor
    factor = floor if factor is None else min(1.0, max(0.0, factor))
    values = {"continue_factor": factor, "continue_progress": min(1.0, at)}
    config = _with(config, {"scheduler": values})
    lr, new_cap = config.optimizer.lr, config.run.max_steps
    ends = f"{_end(budget, cap)} -> {_end(new_budget, new_cap)}"
    notes.append(
        f"--resume: the run's end changed ({ends}): "
        f"the LR decays on from {lr * factor:.2e} at step {step} to {lr * floor:.2e} at the new "
        "end (scheduler.continue_factor); it never rises"
    )
    return config, notes, None


def _kept_words(budget: float, seconds: float) -> str:
    left = "spent: nothing left to train" if seconds >= budget else f"{seconds:.1f} s trained"
    return (
        f"--resume: run.time_budget_s: {budget:g} s kept from the checkpoint ({left}); "
        "--time-budget DURATION sets another, --max-steps N ends the run by steps instead"
    )


def _end(budget: float | None, cap: Any) -> str:
    steps = f"max_steps {_steps(cap)}"
    return f"time_budget_s {budget:g}, {steps}" if budget else steps


def _steps(value: Any) -> str:
    return "2**40 (no cap)" if value == 2**40 else str(value)


def _numbers(*values: Any) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _with(config: SpeedtronicConfig, values: dict[str, dict[str, Any]]) -> SpeedtronicConfig:
    raw = config.to_dict(redact=False)
    for section, keys in values.items():
        raw[section].update(keys)
    return type(config).from_dict(raw)

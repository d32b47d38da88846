"""The run's clock: training seconds, start-up seconds, and the time budget that ends a run.

Training time starts when a process completes its first optimizer step: everything before it
(start-up, data checks, building the model) and the step itself (compile warm-up, first
allocations) counts as start-up, reported apart. From there the clock runs with the loop, the
evaluations and checkpoints inside it included, and stops at the last step's end. A checkpoint
keeps the seconds spent, so ``--resume`` continues the same budget.

With ``run.time_budget_s`` the step that brings the seconds to the budget is the last: the
clock ends the run there as if ``max_steps`` were that step, so every plug-in that acts on the
last step (the final evaluation, a DiLoCo node's last sync) does, and the run ends as a
completed one. The schedule reads ``progress()``. A DDP group agrees on the largest rank's
seconds each step: every rank stops at the same step with the same learning rate.
"""

from __future__ import annotations

import time
from typing import Any


def now() -> float:
    """The clock's time source (seconds, monotonic); tests put a fake clock here."""
    return time.perf_counter()


class RunClock:
    """A Trainer plug-in; the first in the list, so later plug-ins see this step's verdict."""

    name = "clock"

    def __init__(self, budget_s: float | None, began: float | None = None):
        self.budget_s = budget_s
        self.began = now() if began is None else began  # this process's start
        self.seconds = 0.0  # training seconds at the latest step's end, over every part
        self.tokens = 0  # tokens trained in those seconds
        self.startup_before = 0.0  # earlier parts' start-up seconds (resume)
        self.startup_s: float | None = None  # this part's, once its clock started
        self.budget_reached = False
        self.measured_step: int | None = None  # the step self.seconds was measured at
        self._base: tuple[float, float, int, int] | None = None  # at this part's clock start
        # (step, words): a budget ending before that step warns (see ``milestones``)
        self.milestones: list[tuple[int, str]] = []

    def progress(self) -> float:
        """The budget's share spent, in [0, 1] (0 without a budget)."""
        return min(1.0, self.seconds / self.budget_s) if self.budget_s else 0.0

    def at(self, step: int) -> float:
        """Training seconds at the end of ``step``: the clock's figure once it measured that
        step (an evaluation of it does not count), else this process's reading now."""
        if self._base is None or step == self.measured_step:
            return self.seconds
        start, seconds, _, _ = self._base
        return seconds + now() - start

    def startup_seconds(self) -> float:
        """Start-up of every part; this one's runs until its first step ends."""
        mine = self.startup_s if self.startup_s is not None else now() - self.began
        return self.startup_before + mine

    def after_optimizer_step(self, trainer: Any) -> None:
        moment = now()
        if self._base is None:  # this part's first step: the clock starts at its end
            self.startup_s = moment - self.began
            self._base = (moment, self.seconds, self.tokens, trainer.tokens)
            return
        start, seconds, tokens, trainer_tokens = self._base
        self.tokens = tokens + trainer.tokens - trainer_tokens
        seconds += moment - start
        self.seconds = _agreed(trainer, seconds) if self.budget_s else seconds
        self.measured_step = trainer.step
        self.end_if_spent(trainer)

    def end_if_spent(self, trainer: Any) -> bool:
        """End the run at this step when the budget is spent (also before a resumed run's first
        step); True when it is."""
        if self.budget_s is None or self.seconds < self.budget_s:
            return False
        if not self.budget_reached:
            self.budget_reached = True
            trainer.logger.notice(
                f"run.time_budget_s: {self.seconds:.1f} s of the {self.budget_s:g} s budget "
                f"trained at step {trainer.step}; ending the run"
            )
            short = [words for step, words in self.milestones if trainer.step < step]
            if short:
                trainer.logger.warn(
                    f"run.time_budget_s: the {self.budget_s:g} s budget ended at step "
                    f"{trainer.step}, {' and '.join(short)}: a larger budget compares more than "
                    "the start of training"
                )
        trainer.options.max_steps = trainer.step
        return True

    def state_dict(self) -> dict[str, Any]:
        return {
            "train_seconds": self.seconds,
            "train_tokens": self.tokens,
            "startup_seconds": self.startup_seconds(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seconds = float(state.get("train_seconds", 0.0))
        self.tokens = int(state.get("train_tokens", 0))
        self.startup_before = float(state.get("startup_seconds", 0.0))


def milestones(config: Any) -> list[tuple[int, str]]:
    """The steps a budget should reach: the warmup's end and the first scheduled evaluation
    (of ``data.eval_every``'s split or of ``eval.sets``), each with its words."""
    marks = []
    warmup = config.scheduler.warmup_steps
    if warmup:
        marks.append((warmup, f"inside the LR warmup (scheduler.warmup_steps {warmup})"))
    data = config.data
    cadences = []
    if data.eval_every and (data.eval_path or data.eval_fraction):
        cadences.append((data.eval_every, "data.eval_every"))
    if config.eval.sets and (config.eval.every or data.eval_every):
        key = "eval.every" if config.eval.every else "data.eval_every"
        cadences.append((config.eval.every or data.eval_every, key))
    if cadences:
        every, key = min(cadences)
        marks.append((every, f"before the first evaluation ({key} {every})"))
    return marks


def _agreed(trainer: Any, seconds: float) -> float:
    """One figure for a DDP group (the slowest rank's); a single process's own otherwise."""
    if trainer.parallel is None:
        return seconds
    import torch
    import torch.distributed as dist

    figure = torch.tensor([seconds], dtype=torch.float64, device=trainer.precision.device)
    dist.all_reduce(figure, op=dist.ReduceOp.MAX)
    return float(figure)

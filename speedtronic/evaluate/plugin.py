"""Named held-out sets scored during training: a Trainer plug-in, one ``eval_set`` event per set.

At the eval cadence (``eval.every``, else ``data.eval_every``, and at the last step) each set's
windows are scored with the one scorer over the model being trained, in eval mode and without
gradients; the model goes back to train mode and every RNG stream is restored, so a run with
these evaluations trains bit-identically to one without. In a DDP group each rank scores every
``world``-th window and the group sums nats and tokens: the figure one process would give.
The scorer reads the plain module (DDP's wrapper and a compiled graph would sync or recompile
for each new window length). After the first step a large evaluation is priced in one notice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from speedtronic.evaluate.scorer import Scorer
from speedtronic.evaluate.sets import HeldOutSet
from speedtronic.evaluate.text import summarize
from speedtronic.train.trainer import rng_state, set_rng_state

NOTICE_S = 30.0  # evaluations estimated to take less are not worth a line


class HeldOutSetsPlugin:
    name = "eval_sets"

    def __init__(
        self,
        sets: list[HeldOutSet],
        every: int,
        window: int,
        batch_size: int,
        shard: tuple[int, int] = (0, 1),
        sum_across: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.sets, self.every, self.window, self.batch_size = sets, every, window, batch_size
        self.rank, self.world = shard
        self.sum_across = sum_across
        self.last: dict[str, dict[str, float]] = {}  # set name -> its last figures (meta.json)
        self._begun: tuple[float, int, int] | None = None  # (time, step, tokens) at the start

    def on_train_start(self, trainer: Any) -> None:
        self._begun = (time.perf_counter(), trainer.step, trainer.tokens)

    def after_optimizer_step(self, trainer: Any) -> None:
        if self._begun is not None:
            self._cost_notice(trainer, *self._begun)
            self._begun = None
        if trainer.step % self.every == 0 or trainer.step == trainer.options.max_steps:
            self.evaluate(trainer)

    def _cost_notice(self, trainer: Any, begun: float, step: int, tokens: int) -> None:
        """After the first step, before any scoring: what the evaluations will cost, in one
        line, when that is much (a forward pass costs about a third of a training step's
        compute per token, so the first step's pace prices them; warm-up makes it high)."""
        steps, end = max(trainer.step - step, 1), trainer.options.max_steps
        step_s, step_tokens = (
            (time.perf_counter() - begun) / steps,
            (trainer.tokens - tokens) / steps,
        )
        per_eval = sum(held.tokens for held in self.sets)
        count = end // self.every - step // self.every + (1 if end % self.every else 0)
        eval_s = step_s * per_eval * count / max(3 * step_tokens, 1)
        train_s = step_s * (end - step)
        if eval_s >= NOTICE_S and eval_s >= train_s / 4:
            trainer.logger.notice(
                f"eval.sets: {per_eval:,} tokens scored per evaluation x {count} evaluations: "
                f"about {eval_s:,.0f} s at the first step's pace, against {train_s:,.0f} s of "
                "training; lower eval.max_tokens or raise eval.every to spend less"
            )

    def evaluate(self, trainer: Any) -> dict[str, dict[str, float]]:
        model = plain_module(trainer.model)
        precision = trainer.precision
        scorer = Scorer(model, self.window, self.batch_size, precision.device, precision.autocast)
        rng = rng_state()
        model.eval()
        try:
            for held in self.sets:
                self._score(trainer, scorer, held)
        finally:
            model.train()
            set_rng_state(rng)
        return self.last

    def _score(self, trainer: Any, scorer: Scorer, held: HeldOutSet) -> None:
        started = time.perf_counter()
        scores = scorer.score(held.requests[self.rank :: self.world])
        totals = torch.tensor(
            [-sum(s.logprob for s in scores), float(sum(s.tokens for s in scores))],
            dtype=torch.float64 if scorer.device.type != "mps" else torch.float32,
            device=scorer.device,
        )
        if self.sum_across is not None:
            totals = self.sum_across(totals)
        nats, tokens = float(totals[0]), int(totals[1])
        figures = summarize(nats, tokens, held.bytes)
        payload = {
            "step": trainer.step,
            "set": held.name,
            "loss": figures.loss,
            "bits_per_byte": figures.bits_per_byte,
            "tokens": tokens,
            "text_bytes": held.bytes,
            "eval_s": time.perf_counter() - started,
        }
        trainer.logger.log("eval_set", payload)
        self.last[held.name] = {
            "step": trainer.step,
            "loss": figures.loss,
            "bits_per_byte": figures.bits_per_byte,
        }


def plain_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module under a DistributedDataParallel wrapper (itself otherwise)."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model

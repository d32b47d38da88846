"""Held-out evaluation as a Trainer plug-in: eval loss and perplexity every ``eval_every`` steps
and at the last step (with ``eval_every: 0`` only there: litgpt's final validation, issue 53),
and bits per byte where the split's text bytes are known (``data.loader.bytes_per_token``).

Each evaluation reads the same first ``eval_batches`` batches of the held-out set, under
``torch.no_grad`` and ``model.eval()``, then puts the model back in train mode and restores
every RNG stream, so a run with evaluation trains bit-identically to one without.

In a DDP group each rank computes every ``world``-th of those batches and ``sum_across``
adds the ranks' sums: the same figure as one process, in 1/world of the time.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from speedtronic.train.trainer import (
    IGNORE_INDEX,
    call_model,
    extract_loss,
    labels_of,
    move_to,
    rng_state,
    set_rng_state,
)


class EvalPlugin:
    name = "eval"

    def __init__(
        self,
        loader: Any,
        every: int,
        batches: int,
        shard: tuple[int, int] = (0, 1),
        sum_across: Callable[[torch.Tensor], torch.Tensor] | None = None,
        bytes_per_token: Callable[[], float | None] | None = None,
    ):
        self.loader, self.every, self.batches = loader, every, batches
        self.rank, self.world = shard
        self.sum_across = sum_across  # the group's all-reduce (sum); None: one process
        self.bytes_per_token = bytes_per_token  # None: the split's bytes are unknown
        self.last: tuple[int, float] | None = None  # (step, eval loss): checkpoints record it
        self.bits_per_byte: float | None = None  # of the last evaluation, where known

    def after_optimizer_step(self, trainer: Any) -> None:
        due = self.every and trainer.step % self.every == 0
        if due or trainer.step == trainer.options.max_steps:
            self.evaluate(trainer)

    def evaluate(self, trainer: Any) -> dict[str, float]:
        started = time.perf_counter()
        rng = rng_state()
        trainer.model.eval()
        try:
            with torch.no_grad():
                loss, tokens = self._mean_loss(trainer)
        finally:
            trainer.model.train()
            set_rng_state(rng)
        payload = {
            "step": trainer.step,
            "eval_loss": loss,
            "eval_ppl": math.exp(min(loss, 50.0)),
            "eval_tokens": tokens,
            "eval_s": time.perf_counter() - started,
        }
        per_token = self.bytes_per_token() if self.bytes_per_token is not None else None
        self.bits_per_byte = loss / math.log(2) / per_token if per_token else None
        payload["eval_bits_per_byte"] = self.bits_per_byte
        trainer.logger.log("eval", payload)
        self.last = (trainer.step, loss)
        return payload

    def _mean_loss(self, trainer: Any) -> tuple[float, int]:
        """Token-weighted mean loss over the eval batches (one host read at the end)."""
        device = trainer.precision.device
        total = torch.zeros((), device=device)  # float32: MPS has no float64
        count = torch.zeros((), device=device)
        for index, batch in enumerate(itertools.islice(self.loader, self.batches)):
            if index % self.world != self.rank:
                continue  # another rank's batch
            batch = move_to(batch, device, non_blocking=device.type == "cuda")
            with trainer.precision.autocast():
                loss = extract_loss(call_model(trainer.model, batch)).float()
            labels = labels_of(batch)
            integer = isinstance(labels, torch.Tensor) and not labels.is_floating_point()
            weight = (labels != IGNORE_INDEX).sum() if integer else torch.ones((), device=device)
            total += loss * weight
            count += weight
        if self.sum_across is not None:
            total, count = self.sum_across(torch.stack([total, count]))
        tokens = int(count)
        return float(total / max(tokens, 1)), tokens

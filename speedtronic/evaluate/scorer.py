"""The one scorer: log-probabilities of continuations given contexts, batched.

A request is a context (token ids, at least one) and a continuation (at least one id); its
score is the summed natural-log probability the model gives the continuation's tokens, each
given everything before it, and how many tokens that sum covers. Requests are sorted by length,
packed into batches padded on the right, and their scores handed back in the order given.

A batch holds at most ``batch_size`` rows and no more than keep its float32 logits within
``logits_budget`` bytes (``rows_per_batch``; one row at least): 16 windows of an 8k-context,
49k-vocabulary model asked for 25.8 GB at once (issue 55). The log-softmax reads the logits in
slices within the same budget. Each row's score is computed alone either way, so the scores do
not depend on how the rows were batched.

Right padding needs no attention mask for a causal model (position t reads positions <= t
only, so the padding after a sequence changes none of its logits); that is the one assumption
the scorer makes about the model, beside ``forward(input_ids)`` returning logits. A request
longer than the window keeps its newest ``window`` inputs: the context is cut from the left,
the continuation never (one that does not fit is refused).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from speedtronic.errors import DataError
from speedtronic.modelout.generate import logits_of, vocab_size

IGNORE = -100
LOGITS_BUDGET = 256 * 2**20  # bytes of float32 logits a forward (and a log-softmax) may make


@dataclass(frozen=True)
class Request:
    context: Sequence[int]
    continuation: Sequence[int]
    where: str = ""  # what the request came from (FILE:LINE, ending N), for messages


@dataclass(frozen=True)
class Score:
    logprob: float  # summed natural-log probability of the continuation's tokens
    tokens: int  # how many tokens the sum covers (the continuation's)

    @property
    def mean(self) -> float:
        return self.logprob / max(self.tokens, 1)


class Scorer:
    """Scores requests with ``model`` (eval mode, no grad) on ``device`` under ``autocast``."""

    def __init__(
        self,
        model: nn.Module,
        window: int,
        batch_size: int = 16,
        device: torch.device | None = None,
        autocast: Callable[[], contextlib.AbstractContextManager] | None = None,
        logits_budget: int = LOGITS_BUDGET,
    ):
        if window < 1 or batch_size < 1:
            raise ValueError(f"window and batch_size must be >= 1 (got {window}, {batch_size})")
        self.model, self.window, self.batch_size = model, window, batch_size
        self.device = device or next(model.parameters()).device
        self.autocast = autocast or contextlib.nullcontext
        self.vocab = vocab_size(model)
        self.width = self.vocab  # of the logits; a model that names no vocabulary: its first's
        self.logits_budget = logits_budget

    def score(
        self, requests: Sequence[Request], progress: Callable[[int], None] | None = None
    ) -> list[Score]:
        """One Score per request, in order; ``progress(n)`` after each batch of n requests."""
        rows = [self._row(index, r) for index, r in enumerate(requests)]
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        scores: list[Score | None] = [None] * len(rows)
        start = 0
        while start < len(order):
            longest = len(rows[order[start]][0]) - 1  # sorted: the batch's padded length
            take = rows_per_batch(longest, self.width, self.batch_size, self.logits_budget)
            chunk = order[start : start + take]
            for index, score in zip(chunk, self._batch([rows[i] for i in chunk]), strict=True):
                scores[index] = score
            if progress is not None:
                progress(len(chunk))
            start += take
        return scores  # type: ignore[return-value]

    def _row(self, index: int, request: Request) -> tuple[list[int], int]:
        """(the ids to read, newest ``window`` + 1 of them, and how many of the last are scored)."""
        context, continuation = list(request.context), list(request.continuation)
        where = request.where or f"request {index}"
        if not context or not continuation:
            raise DataError(f"{where}: needs a context and a continuation of >= 1 token")
        if len(continuation) > self.window:
            raise DataError(
                f"{where}: a continuation of {len(continuation)} tokens does not fit "
                f"the model's window ({self.window} tokens)"
            )
        full = (context + continuation)[-(self.window + 1) :]
        if self.vocab is not None and max(full) >= self.vocab:
            raise DataError(
                f"{where}: token id {max(full)} is outside the model's vocabulary "
                f"({self.vocab}): the tokenizer does not fit this model"
            )
        return full, len(continuation)

    @torch.no_grad()
    def _batch(self, rows: Iterable[tuple[list[int], int]]) -> list[Score]:
        rows = list(rows)
        length = max(len(ids) for ids, _ in rows) - 1
        inputs = torch.zeros((len(rows), length), dtype=torch.long)
        targets = torch.full((len(rows), length), IGNORE, dtype=torch.long)
        for b, (ids, scored) in enumerate(rows):
            n = len(ids) - 1
            inputs[b, :n] = torch.tensor(ids[:-1])
            targets[b, n - scored : n] = torch.tensor(ids[-scored:])
        inputs, targets = inputs.to(self.device), targets.to(self.device)
        with self.autocast():
            logits = logits_of(self.model, inputs).flatten(0, 1)  # (B*T, vocab)
        self.width, targets = logits.shape[-1], targets.flatten()
        step = max(1, self.logits_budget // (4 * self.width))  # positions per log-softmax
        nats = torch.cat(  # float32: bf16 log-softmax over a vocabulary is visibly off
            [
                F.cross_entropy(
                    logits[i : i + step].float(),
                    targets[i : i + step],
                    ignore_index=IGNORE,
                    reduction="none",
                )
                for i in range(0, len(targets), step)
            ]
        ).view(len(rows), length)  # (B, T), 0 where ignored
        sums = (-nats.sum(dim=1)).tolist()  # one host read per batch
        return [Score(s, scored) for s, (_, scored) in zip(sums, rows, strict=True)]


def rows_per_batch(length: int, width: int | None, batch_size: int, budget: int) -> int:
    """Rows of ``length`` positions one forward takes: at most ``batch_size``, and no more than
    keep their float32 logits ((rows, length, width) x 4 bytes) within ``budget``; one row at
    least, whatever it costs. ``width`` None (no vocabulary known before a first forward): 1."""
    if width is None:
        return 1
    return max(1, min(batch_size, budget // (4 * length * width)))

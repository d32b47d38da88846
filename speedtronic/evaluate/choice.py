"""Multiple-choice scoring: every choice of every item as one continuation, batched together.

``acc`` counts items whose right choice has the highest summed log-probability; ``acc_norm``
those whose right choice has the highest mean log-probability per choice token (llm.c's
``avg_loss``, nanoGPT's HellaSwag), which does not favour short choices. Ties go to the lowest
index, as ``argmax`` does. Context and choice are tokenized separately, as llm.c does, so the
choice's tokens are exactly the ones scored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from speedtronic.evaluate.scorer import Request, Score, Scorer
from speedtronic.evaluate.tasks import Item


@dataclass
class ChoiceResult:
    n: int
    acc: float
    acc_norm: float
    examples: list[dict[str, Any]] = field(default_factory=list)


def requests_of(tokenizer: Any, items: Sequence[Item]) -> list[Request]:
    requests = []
    for item in items:
        context = list(tokenizer(item.context))
        requests += [
            Request(context, list(tokenizer(c)), f"{item.where}: ending {j}")
            for j, c in enumerate(item.choices)
        ]
    return requests


def score_choices(
    scorer: Scorer,
    tokenizer: Any,
    items: Sequence[Item],
    progress: Callable[[int], None] | None = None,
) -> ChoiceResult:
    """Accuracy by summed and by mean log-probability over ``items``, with per-item details."""
    scores = iter(scorer.score(requests_of(tokenizer, items), progress))
    examples = [_example(item, [next(scores) for _ in item.choices]) for item in items]
    n = len(examples)
    return ChoiceResult(
        n,
        sum(e["pred"] == e["label"] for e in examples) / max(n, 1),
        sum(e["pred_norm"] == e["label"] for e in examples) / max(n, 1),
        examples,
    )


def _example(item: Item, scores: list[Score]) -> dict[str, Any]:
    sums, means = [s.logprob for s in scores], [s.mean for s in scores]
    return {
        "where": item.where,
        "label": item.label,
        "pred": _argmax(sums),
        "pred_norm": _argmax(means),
        "logprobs": sums,
        "tokens": [s.tokens for s in scores],
    }


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=lambda i: (values[i], -i))

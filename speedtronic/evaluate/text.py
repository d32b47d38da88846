"""Loss and bits per byte of a model over a text, by the scorer's continuations.

Windowing rule: the text is tokenized whole; its first token is context only (nothing before
it predicts it). The other tokens are scored in consecutive chunks of ``stride`` tokens, each
chunk given the ``window + 1 - stride`` tokens before it (fewer at the start) as context, so
every token is scored exactly once. ``stride = window`` (the default) reads the text in the
same non-overlapping blocks training does: fast, each token seeing on average half a window.
A smaller stride gives every token more context (a lower, fairer figure) at window / stride
times the cost.

Bits per byte = nats per token x tokens scored / bytes those tokens came from / ln 2. The
bytes are the text's UTF-8 bytes minus those of the first (unscored) token: counted from the
text, so two tokenizers of the same text are measured on the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from speedtronic.errors import DataError
from speedtronic.evaluate.scorer import Request, Scorer


@dataclass(frozen=True)
class TextScore:
    loss: float  # mean nats per scored token
    bits_per_byte: float
    tokens: int  # tokens scored
    bytes: int  # UTF-8 bytes those tokens came from

    def as_dict(self) -> dict[str, Any]:
        return {
            "loss": self.loss,
            "bits_per_byte": self.bits_per_byte,
            "tokens": self.tokens,
            "bytes": self.bytes,
        }


def windows(ids: list[int], window: int, stride: int | None = None) -> list[Request]:
    """Every token after the first in exactly one continuation (the rule above)."""
    stride = window if stride is None else stride
    if not 1 <= stride <= window:
        raise DataError(f"stride: must be in [1, window={window}] (got {stride})")
    keep = window + 1 - stride  # context tokens a full chunk leaves room for
    return [
        Request(ids[max(0, start - keep) : start], ids[start : start + stride])
        for start in range(1, len(ids), stride)
    ]


def first_token_bytes(tokenizer: Any, ids: list[int]) -> int:
    """The UTF-8 bytes of the text the first token stands for (the part nobody predicts)."""
    if getattr(tokenizer, "name", None) == "byte":
        return 1
    return len(tokenizer.decode(ids[:1]).encode("utf-8"))


def score_text(
    scorer: Scorer,
    tokenizer: Any,
    text: str,
    stride: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> TextScore:
    """Loss and bits per byte of ``text``; DataError when it is shorter than two tokens."""
    ids = list(tokenizer(text))
    if len(ids) < 2:
        raise DataError(f"the text has {len(ids)} token(s); bits per byte needs at least 2")
    scores = scorer.score(windows(ids, scorer.window, stride), progress)
    return summarize(
        -sum(s.logprob for s in scores),
        sum(s.tokens for s in scores),
        len(text.encode("utf-8")) - first_token_bytes(tokenizer, ids),
    )


def summarize(nats: float, tokens: int, nbytes: int) -> TextScore:
    """Summed nats over ``tokens`` tokens that came from ``nbytes`` bytes, as a TextScore."""
    loss = nats / max(tokens, 1)
    return TextScore(loss, nats / max(nbytes, 1) / math.log(2), tokens, nbytes)

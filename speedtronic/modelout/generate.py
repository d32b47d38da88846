"""Sampling text from a model: greedy or temperature / top-k / top-p, with a KV cache.

A model with ``new_cache`` / ``forward_cached`` (the reference transformer) decodes one token
per step against its cache; any other model works too if its forward gives logits for
``input_ids`` ((B, T, vocab), or an object with ``.logits``), then recomputing the context at
every step. When the context window (the model's training length) fills up, the newest half of
it is kept and decoding goes on. Sampling draws on a CPU generator, so a seed gives the same
text on every device for the same logits. Streaming is the caller's: ``on_token`` sees each
new id as soon as it is chosen; so is stopping early (``stop``: ``modelout.stops.Stopper``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from speedtronic.errors import ConfigError


@dataclass(frozen=True)
class Sampling:
    """How to pick each token. ``temperature`` 0 is greedy (argmax); ``top_k`` keeps the k
    likeliest tokens, ``top_p`` the smallest set whose probability reaches p (None: off)."""

    max_new_tokens: int = 200
    temperature: float = 0.8
    top_k: int | None = None
    top_p: float | None = None


@dataclass
class Sample:
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)  # the new tokens
    seconds: float = 0.0
    slid: int = 0  # how often the context window was full and slid on
    stop_reason: str = "max_tokens"  # or "eos", "stop_text" (modelout.stops)

    @property
    def tokens_per_s(self) -> float:
        return len(self.ids) / self.seconds if self.seconds > 0 else 0.0


class LogitsError(ConfigError):
    """The model's forward does not give logits generation can use (exit 2)."""


def pick(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    """The next token from the last position's logits (vocab,)."""
    if sampling.temperature == 0:
        return int(torch.argmax(logits).item())
    logits = logits.float().cpu() / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < logits.numel():
        kth = torch.topk(logits, sampling.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p is not None and sampling.top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        # drop a token once the likelier ones already reach top_p (the first always stays)
        drop = torch.cumsum(probs, dim=-1) - probs >= sampling.top_p
        drop[0] = False  # a top_p below float32's smallest (1e-300) would drop it too
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator).item())


class Decoder:
    """The model's logits for the next position, one token at a time, within its window."""

    def __init__(self, model: nn.Module, context_len: int, precision: Any):
        self.model, self.context_len = model, context_len
        self.device, self.autocast = precision.device, precision.autocast  # the run's precision
        # keys and values come out of the projections in autocast's dtype when it is on
        self.cache_dtype = precision.dtype or next(model.parameters()).dtype
        self.vocab = vocab_size(model)
        self.cached = callable(getattr(model, "forward_cached", None))
        self.context: list[int] = []
        self.cache: Any = None
        self.slid = 0

    def start(self, ids: list[int]) -> torch.Tensor:
        """Logits (vocab,) after the prompt ``ids`` (their newest ``context_len`` - 1)."""
        check_prompt(ids, self.vocab)
        self.context = list(ids[-(self.context_len - 1) :])
        return self._prefill()

    def step(self, token: int) -> torch.Tensor:
        """Logits (vocab,) after one more token."""
        self.context.append(token)
        if len(self.context) > self.context_len:  # full: keep the newest half and go on
            self.context = self.context[-(self.context_len // 2 or 1) :]
            self.slid += 1
            return self._prefill()
        if not self.cached:
            return self._full()
        ids = torch.tensor([[token]], device=self.device)
        with torch.inference_mode(), self.autocast():
            return self.model.forward_cached(ids, self.cache, last_only=True)[0, -1]

    def _prefill(self) -> torch.Tensor:
        if not self.cached:
            return self._full()
        ids = torch.tensor([self.context], device=self.device)
        with torch.inference_mode(), self.autocast():
            self.cache = self.model.new_cache(1, self.context_len, dtype=self.cache_dtype)
            return self.model.forward_cached(ids, self.cache, last_only=True)[0, -1]

    def _full(self) -> torch.Tensor:
        ids = torch.tensor([self.context], device=self.device)
        with torch.inference_mode(), self.autocast():
            return logits_of(self.model, ids)[0, -1]


def check_prompt(ids: list[int], vocab: int | None) -> None:
    """The prompt's ids must exist and be ids the model embeds (``vocab``: ``vocab_size``)."""
    if not ids:
        raise ConfigError("--prompt: empty; generation starts from at least one token")
    if vocab is not None and max(ids) >= vocab:
        raise ConfigError(
            f"--prompt: token id {max(ids)} is outside the model's vocabulary ({vocab}): the "
            "tokenizer does not fit this model"
        )


def vocab_size(model: nn.Module) -> int | None:
    """The ids the model embeds: its config's vocab_size, else its first embedding's rows."""
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(size, int):
        return size
    embedding = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    return embedding.num_embeddings if embedding is not None else None


def logits_of(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """``model(ids)`` as logits (B, T, vocab); anything else is a LogitsError saying what it
    must return."""
    try:
        out = model(ids)
    except TypeError as exc:  # e.g. forward(input_ids, labels) with labels required
        first = str(exc).splitlines()[0] if str(exc) else ""
        out = f"no answer: calling it with input_ids alone raised TypeError ({first})"
    out = getattr(out, "logits", out)
    is_tensor = isinstance(out, torch.Tensor)
    if is_tensor and out.dim() == 3 and tuple(out.shape[:2]) == tuple(ids.shape):
        return out
    got = f"a tensor of shape {tuple(out.shape)}" if is_tensor else type(out).__name__
    got = out if isinstance(out, str) else got
    raise LogitsError(
        f"model {type(model).__name__}: generation needs forward(input_ids) to return logits of "
        f"shape (batch, seq, vocab) = ({ids.shape[0]}, {ids.shape[1]}, vocab) without labels "
        f"(or an object with .logits); it returned {got}"
    )


def generate(
    decoder: Decoder,
    prompt_ids: list[int],
    sampling: Sampling,
    generator: torch.Generator,
    on_token: Callable[[int], None] | None = None,
    stop: Callable[[list[int]], str | None] | None = None,
) -> Sample:
    """Sample up to ``sampling.max_new_tokens`` tokens after ``prompt_ids``, fewer when
    ``stop(new ids)`` gives a reason (an end-of-document token is kept in ``ids`` but not
    streamed); timed from the prompt's forward to the last token (what tokens/s reports)."""
    sample = Sample(list(prompt_ids))
    started = time.perf_counter()
    logits = decoder.start(prompt_ids)
    for n in range(sampling.max_new_tokens):
        token = pick(logits, sampling, generator)
        sample.ids.append(token)
        reason = stop(sample.ids) if stop is not None else None
        if on_token is not None and reason != "eos":
            on_token(token)
        if reason is not None:
            sample.stop_reason = reason
            break
        if n + 1 < sampling.max_new_tokens:
            logits = decoder.step(token)
    _sync(decoder.device)
    sample.seconds, sample.slid = time.perf_counter() - started, decoder.slid
    return sample


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()

"""Which parameters Muon optimizes: the model's hidden weight matrices, chosen by module.

Muon is for the matrices inside the network. The embedding (a lookup, not a matrix product),
the output head (it maps to the vocabulary, whose rows are not a hidden space), norm gains,
biases and anything not 2-D go to AdamW. An ``ndim == 2`` rule gets this wrong twice for a
decoder: the embedding table is 2-D, and when it is tied to the head the one tensor is both.
So the split goes by module identity, in this order:

1. a model that defines ``hidden_matrices()`` (an iterable of its parameters) declares its
   own split: exactly those go to Muon (the reference decoder does: its blocks' projections);
2. otherwise every trainable 2-D ``weight`` of an ``nn.Linear``, except a weight an
   ``nn.Embedding`` also holds (a tied head) and the Linear of an output head, known by the
   name it has in its parent (``HEAD_NAMES``: ``lm_head`` in nanoGPT, GPT-2 and Llama in
   transformers, ``output`` in torchtitan, ``head`` / ``classifier`` in timm and vision
   models). Shapes cannot tell a head from a hidden matrix (a byte-level decoder of width
   256 has a 256 x 256 head and 256 x 256 projections);
3. then ``optimizer.muon_exclude`` (``fnmatch`` patterns on the parameter names of
   ``model.named_parameters()``, e.g. ``blocks.0.*``) moves matching ones to AdamW.

``split_parameters`` returns both lists and the names; problems (a hook that returns a
parameter of another model or a 3-D one, a pattern that matches nothing, no matrix left)
are one ``ConfigError`` each, also on the meta device, so ``validate`` reports them.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from torch import nn

from speedtronic.errors import ConfigError

HOOK = "hidden_matrices"
HEAD_NAMES = frozenset({"lm_head", "head", "output", "classifier", "fc_out", "logits"})


@dataclass
class Split:
    """The two halves of a model's trainable parameters (tied weights once)."""

    muon: list[nn.Parameter] = field(default_factory=list)
    adamw: list[nn.Parameter] = field(default_factory=list)
    muon_names: list[str] = field(default_factory=list)
    adamw_names: list[str] = field(default_factory=list)
    source: str = "nn.Linear"  # or "hidden_matrices()"

    def summary(self) -> str:
        """``muon on 14 matrices (0.39M) from hidden_matrices(); adamw on 5 tensors (0.03M)``."""
        return (
            f"muon on {len(self.muon)} matrices ({_count(self.muon)}) from {self.source}; "
            f"adamw on {len(self.adamw)} tensors ({_count(self.adamw)})"
        )


def _count(params: list[nn.Parameter]) -> str:
    n = sum(p.numel() for p in params)
    return f"{n / 1e6:.2f}M" if n >= 100_000 else f"{n / 1e3:.1f}K"


def split_parameters(model: nn.Module, exclude: list[str] | tuple[str, ...] = ()) -> Split:
    """Muon's parameters and AdamW's, by the rules of the module docstring."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]  # tied: once
    if not named:
        raise ConfigError("model: has no trainable parameters")
    names = {id(p): n for n, p in named}
    hook = getattr(model, HOOK, None)
    if callable(hook):
        chosen, source = _declared(model, hook(), names), f"{HOOK}()"
    else:
        chosen, source = _linear_matrices(model, names), "nn.Linear"
    for pattern in exclude:
        matched = {i for i in chosen if fnmatch.fnmatchcase(names[i], pattern)}
        if not any(fnmatch.fnmatchcase(n, pattern) for n, _ in named):
            raise ConfigError(
                f"optimizer.muon_exclude: {pattern!r} matches no parameter of this model "
                f"(its names look like {named[0][0]!r})"
            )
        chosen -= matched
    if not chosen:
        raise ConfigError(
            "optimizer.name: muon found no hidden 2-D weight matrix in this model "
            f"({source}, after optimizer.muon_exclude); use adamw, or declare them with "
            f"a {HOOK}() method"
        )
    split = Split(source=source)
    for name, p in named:
        if id(p) in chosen:
            split.muon.append(p)
            split.muon_names.append(name)
        else:
            split.adamw.append(p)
            split.adamw_names.append(name)
    return split


def _declared(model: nn.Module, declared: object, names: dict[int, str]) -> set[int]:
    chosen = set()
    for p in declared if isinstance(declared, (list, tuple, set)) else list(declared):
        if not isinstance(p, nn.Parameter) or id(p) not in names:
            raise ConfigError(
                f"model: {type(model).__name__}.{HOOK}() must yield trainable parameters of "
                f"the model itself (got {type(p).__name__})"
            )
        if p.ndim != 2:
            raise ConfigError(
                f"model: {type(model).__name__}.{HOOK}() yielded {names[id(p)]} of shape "
                f"{list(p.shape)}; Muon takes 2-D matrices only"
            )
        chosen.add(id(p))
    return chosen


def _linear_matrices(model: nn.Module, names: dict[int, str]) -> set[int]:
    tied = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return {
        id(m.weight)
        for path, m in model.named_modules()
        if isinstance(m, nn.Linear)
        and id(m.weight) in names
        and m.weight.ndim == 2
        and id(m.weight) not in tied
        and path.rpartition(".")[2] not in HEAD_NAMES
    }

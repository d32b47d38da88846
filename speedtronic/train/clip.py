"""Gradient clipping in one pass over the gradients where the optimizer step can take the scale.

torch's ``clip_grad_norm_`` reads every gradient (the norm) and then writes every gradient (the
scale): on CPU the second pass was ~35% of the Trainer's gap to a hand-written loop (issue 40).
The fused AdamW kernel reads each gradient anyway and divides it by its ``grad_scale`` (how
GradScaler unscales inside the step), so the clip's factor is handed to it as
``grad_scale = 1 / coef`` and costs no pass of its own. Where the step cannot take it (Muon, a
foreach or plain AdamW, a GradScaler that owns ``grad_scale``) the gradients are scaled as torch
does; with ``MuonAdamW`` only Muon's matrices are (its momentum needs the clipped gradient), and
the AdamW part's scale rides on its fused step. Either way the norm returned is the pre-clip
norm and the update is clip-then-step's.
"""

from __future__ import annotations

import math

import torch

CLIP_EPS = 1e-6  # clip_grad_norm_'s: coef = max_norm / (norm + eps), so both paths clip alike


def takes_grad_scale(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` divides the gradients by ``optimizer.grad_scale`` itself."""
    fused = all(group.get("fused") for group in optimizer.param_groups)
    amp_aware = getattr(optimizer, "_step_supports_amp_scaling", False)
    return isinstance(optimizer, torch.optim.Adam) and fused and amp_aware


def scale_taker(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer | None:
    """The optimizer whose step takes ``grad_scale``: this one, or MuonAdamW's AdamW part."""
    for candidate in (optimizer, getattr(optimizer, "adamw", None)):
        if candidate is not None and takes_grad_scale(candidate):
            return candidate
    return None


class GradClip:
    """Clips the global gradient norm (``clip``), then steps (``step``).

    ``fold`` says whether the scale rides on the fused step; it is public so that a benchmark
    can force the two-pass path to compare.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, scaler: bool, foreach: bool):
        self.optimizer, self.foreach = optimizer, foreach
        self.taker = None if scaler else scale_taker(optimizer)
        self.fold = self.taker is not None
        self._scale: torch.Tensor | None = None  # 1 / coef, waiting for the next step

    def clip(self, params: list[torch.nn.Parameter], max_norm: float | None) -> torch.Tensor:
        """The pre-clip global 2-norm; the gradients are clipped to ``max_norm`` (None or 0:
        not at all) now, or inside the next ``step``."""
        self._scale = None
        grads = [p.grad for p in params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, 2.0, foreach=self.foreach)
        if not max_norm or math.isinf(max_norm):
            return norm  # scaling by 1.0 would be a pass for nothing
        if not self.fold:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, self.foreach)
            return norm
        coef = torch.clamp(max_norm / (norm.float() + CLIP_EPS), max=1.0)
        self._scale = coef.reciprocal()
        taken = {id(p) for group in self.taker.param_groups for p in group["params"]}
        rest = [p for p in params if id(p) not in taken]  # Muon's: scaled here
        if rest:
            torch.nn.utils.clip_grads_with_norm_(rest, max_norm, norm, self.foreach)
        return norm

    def step(self) -> None:
        """The optimizer's step, dividing by the pending clip scale where there is one."""
        scale, self._scale = self._scale, None
        if scale is None:
            self.optimizer.step()
            return
        self.taker.grad_scale = scale  # what Adam.step hands to its fused kernel
        try:
            self.optimizer.step()
        finally:
            del self.taker.grad_scale

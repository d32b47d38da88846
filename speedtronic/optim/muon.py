"""Muon: momentum, then Newton-Schulz orthogonalisation, for the hidden weight matrices.

This module owns the Muon optimizer and its arithmetic. ``Muon`` is ``torch.optim.Muon``'s
algorithm (torch 2.13, ``torch/optim/_muon.py``: the same param-group keys, the same
``momentum_buffer`` state, the same quintic coefficients, momentum as a lerp, Nesterov, the two
lr adjustments and decoupled weight decay with the unadjusted lr), so a state dict of either
loads into the other. It differs in two ways, both for speed:

- matrices of the same shape (after turning tall ones on their side, as the iteration does)
  are stacked and orthogonalised together with batched matmuls: one ``baddbmm`` per shape per
  iteration instead of one ``addmm`` per matrix (the reference decoder has 3 shapes per model,
  not 7 matrices per block);
- the iteration runs in ``ns_dtype``: bfloat16 where it is native (what torch always uses),
  float32 where bfloat16 is emulated (an AVX2 CPU, where torch's version took 452 ms against
  33 ms, issue 30). ``ns_precision`` decides it from the device and the precision probe.

Also a momentum warm-up (Jordan's speedrun: 0.85 to the group's momentum over the first
``momentum_warmup_steps`` steps), counted per group in ``muon_steps`` so that it resumes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

# Jordan's quintic coefficients (kellerjordan.github.io/posts/muon), as torch.optim.Muon has them
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7
MOMENTUM_START = 0.85  # the speedrun's momentum at step 0 when the warm-up is on
ADJUSTMENTS = ("original", "match_rms_adamw")


def ns_precision(device: torch.device, requested: str = "auto") -> torch.dtype:
    """The dtype of the Newton-Schulz iteration: bf16 where it is native, else fp32.

    ``auto``: bfloat16 on CUDA that supports it and on a CPU the machine's bf16 verdict finds
    native (``emulation.verdict``: AVX512-BF16, AMX), float32 elsewhere (MPS, CPUs that
    emulate bf16). The verdict, not a fresh timing: a busy moment must not change the numerics.
    """
    if requested != "auto":
        return torch.bfloat16 if requested == "bf16" else torch.float32
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if device.type == "cpu":
        from speedtronic.train import emulation

        try:
            emulated = emulation.verdict("bf16").emulated
        except RuntimeError:  # a build without the bf16 CPU kernel
            return torch.float32
        return torch.float32 if emulated else torch.bfloat16
    return torch.float32


def adjusted_lr(lr: float, adjust: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's lr per matrix: ``original`` (Jordan) sqrt(max(1, rows/cols)), so the
    update's spectral norm is about lr; ``match_rms_adamw`` (Moonlight) 0.2 sqrt(max(rows,
    cols)), so its RMS is AdamW's and AdamW's lr and weight decay carry over."""
    rows, cols = shape[:2]
    if adjust is None or adjust == "original":
        return lr * math.sqrt(max(1.0, rows / cols))
    if adjust == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr


def newton_schulz(
    x: Tensor, steps: int, coefficients: tuple = NS_COEFFICIENTS, eps: float = NS_EPS
) -> Tensor:
    """Orthogonalise each matrix of the stack ``x`` (N, rows, cols) with rows <= cols.

    The quintic iteration of torch.optim.Muon, batched: each matrix is scaled to a Frobenius
    norm of 1 (so its spectral norm is at most 1), then ``steps`` times
    X <- a X + (b A + c A^2) X with A = X X^T. Runs in ``x``'s dtype.
    """
    a, b, c = coefficients
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT  # (N, rows, rows)
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.baddbmm(x, poly, x, beta=a)
    return x


def orthogonalise(
    updates: list[Tensor],
    steps: int,
    dtype: torch.dtype,
    coefficients: tuple = NS_COEFFICIENTS,
    eps: float = NS_EPS,
) -> list[Tensor]:
    """The Newton-Schulz image of every update, stacking matrices of one (oriented) shape."""
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, u in enumerate(updates):
        rows, cols = u.shape
        by_shape.setdefault((min(rows, cols), max(rows, cols)), []).append(i)
    out: list[Tensor] = [updates[0]] * len(updates)
    for members in by_shape.values():
        # tall matrices on their side: the Gram matrix is the small one, as in torch's version
        tall = [updates[i].shape[0] > updates[i].shape[1] for i in members]
        stack = torch.stack(
            [updates[i].mT if t else updates[i] for i, t in zip(members, tall, strict=True)]
        )
        stack = newton_schulz(stack.to(dtype), steps, coefficients, eps)
        for k, (i, t) in enumerate(zip(members, tall, strict=True)):
            out[i] = stack[k].mT if t else stack[k]
    return out


class Muon(torch.optim.Optimizer):
    """torch.optim.Muon's update, with same-shape matrices stacked and ``ns_dtype`` chosen.

    ``ns_dtype`` belongs to the device, not to the run: it is an attribute, never a param-group
    key, so a checkpoint written on a GPU (bf16) resumes on a CPU that emulates bf16 (fp32).
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
        momentum_warmup_steps: int = 0,
        ns_dtype: torch.dtype = torch.bfloat16,
    ):
        if adjust_lr_fn not in (None, *ADJUSTMENTS):
            raise ValueError(f"adjust_lr_fn: one of {ADJUSTMENTS} or None (got {adjust_lr_fn!r})")
        defaults = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_coefficients": NS_COEFFICIENTS,
            "eps": NS_EPS,
            "ns_steps": ns_steps,
            "adjust_lr_fn": adjust_lr_fn,
            "momentum_warmup_steps": momentum_warmup_steps,
            "muon_steps": 0,
        }
        super().__init__(params, defaults)
        self.ns_dtype = ns_dtype
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon takes 2-D parameters only (got {tuple(p.shape)})")

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 (torch's signature)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._step_group(group)
        return loss

    def _step_group(self, group: dict) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        grads = [p.grad for p in params]
        if any(g.is_sparse for g in grads):
            raise RuntimeError("Muon does not support sparse gradients")
        bufs = [self._buffer(p) for p in params]
        momentum = self._momentum(group)
        torch._foreach_lerp_(bufs, grads, 1 - momentum)
        updates = torch._foreach_lerp(grads, bufs, momentum) if group["nesterov"] else bufs
        ortho = orthogonalise(
            updates, group["ns_steps"], self.ns_dtype, group["ns_coefficients"], group["eps"]
        )
        lr, decay = group["lr"], group["weight_decay"]
        if decay:
            torch._foreach_mul_(params, 1 - lr * decay)
        for p, o in zip(params, ortho, strict=True):
            p.add_(o, alpha=-adjusted_lr(lr, group["adjust_lr_fn"], p.shape))

    def _buffer(self, p: Tensor) -> Tensor:
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
        return state["momentum_buffer"]

    @staticmethod
    def _momentum(group: dict) -> float:
        """The group's momentum, ramped up from 0.85 over its warm-up steps (if any)."""
        warmup = group.setdefault("momentum_warmup_steps", 0)
        step = group.setdefault("muon_steps", 0)
        group["muon_steps"] = step + 1
        target = group["momentum"]
        if not warmup or step >= warmup:
            return target
        start = min(MOMENTUM_START, target)
        return start + (target - start) * step / warmup

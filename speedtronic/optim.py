"""Optimizer and learning-rate schedule built from the config.

AdamW with weight decay on matrices only (norm gains, biases and other vectors are not
decayed), the fused kernel wherever constructing it succeeds (CUDA, and CPU on recent
PyTorch), else the foreach kernel. Schedules: linear warmup then cosine to
``min_lr_ratio * lr``, or constant after warmup.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from speedtronic.config import OptimizerConfig, SchedulerConfig
from speedtronic.errors import ConfigError


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for param in model.parameters():  # parameters() yields tied weights once
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    if not decay and not no_decay:
        raise ConfigError("model: has no trainable parameters")
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(
    model: nn.Module, cfg: OptimizerConfig, warn: Callable[[str], None]
) -> tuple[torch.optim.Optimizer, str]:
    """Return the AdamW optimizer and the kernel used: "fused", "foreach" or "default"."""
    groups = param_groups(model, cfg.weight_decay)
    kwargs = dict(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)
    if cfg.fused is not False:
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs), "fused"
        except (RuntimeError, TypeError, ValueError) as exc:
            if cfg.fused is True:
                warn(
                    f"optimizer.fused: the fused AdamW kernel is unavailable here ({exc}); "
                    "using foreach"
                )
    try:
        return torch.optim.AdamW(groups, foreach=True, **kwargs), "foreach"
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, **kwargs), "default"


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: SchedulerConfig, horizon: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg, horizon))


def lr_factor(cfg: SchedulerConfig, horizon: int) -> Callable[[int], float]:
    """Multiplier of the base lr at optimizer step ``step`` (0-based)."""
    warmup, floor = cfg.warmup_steps, cfg.min_lr_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.name == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, horizon - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor

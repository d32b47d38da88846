"""Optimizer and learning-rate schedule built from the config.

``optimizer.name: adamw``: AdamW with weight decay on matrices only (norm gains, biases and
other vectors are not decayed), the fused kernel wherever constructing it succeeds (CUDA, and
CPU on recent PyTorch), else the foreach kernel. ``muon``: ``MuonAdamW``, Muon
(``speedtronic.optim.muon``) on the hidden matrices ``speedtronic.optim.param_split`` picks and
that same AdamW on everything else, as one optimizer: one ``state`` (so a DiLoCo reset clears
both), one ``state_dict`` in torch's format whose param groups say which is which (``kind``),
one set of param groups for the schedule. Schedules: linear warmup, then cosine to
``min_lr_ratio * lr``, constant, or warmup-stable-decay (``wsd``: constant, then linear to
``min_lr_ratio * lr`` over the last ``decay_fraction`` of the steps); a re-warm restarts one
of these from a resumed step (``scheduler.rewarm_steps``). A decay is a function of the
progress through it, in [0, 1]: of the steps, or with a time budget (``run.time_budget_s``)
of the budget's seconds or of the steps, whichever is further along (``progress_factor``). A
run resumed with a new end (``checkpoint.run_end``) decays on from the LR it stood at, never up.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from speedtronic.config import OptimizerConfig, SchedulerConfig
from speedtronic.errors import CheckpointError, ConfigError
from speedtronic.optim.muon import Muon, ns_precision
from speedtronic.optim.param_split import Split, split_parameters

MUON_SPECTRAL_LR = 0.02  # Jordan's lr for the "original" adjustment


def param_groups(params: list[nn.Parameter] | nn.Module, weight_decay: float) -> list[dict]:
    """AdamW's two groups: matrices decayed, vectors (norm gains, biases) not."""
    if isinstance(params, nn.Module):
        params = trainable(params)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def trainable(model: nn.Module) -> list[nn.Parameter]:
    params = [p for p in model.parameters() if p.requires_grad]  # tied weights once
    if not params:
        raise ConfigError("model: has no trainable parameters")
    return params


def build_optimizer(
    model: nn.Module, cfg: OptimizerConfig, warn: Callable[[str], None]
) -> tuple[torch.optim.Optimizer, str]:
    """The configured optimizer and the AdamW kernel used: "fused", "foreach" or "default"."""
    if cfg.name == "muon":
        split = split_parameters(model, cfg.muon_exclude)
        adamw, kernel = build_adamw(split.adamw, cfg, warn)
        device = split.muon[0].device
        muon = Muon(
            split.muon,
            lr=muon_lr(cfg),
            weight_decay=muon_weight_decay(cfg),
            momentum=cfg.muon_momentum,
            nesterov=cfg.muon_nesterov,
            ns_steps=cfg.muon_ns_steps,
            adjust_lr_fn=cfg.muon_lr_adjust,
            momentum_warmup_steps=cfg.muon_momentum_warmup_steps,
            ns_dtype=ns_precision(device, cfg.muon_precision),
        )
        return MuonAdamW(muon, adamw, split), kernel
    optimizer, kernel = build_adamw(trainable(model), cfg, warn)
    optimizer.register_load_state_dict_pre_hook(_refuse_other_kind)
    return optimizer, kernel


def muon_lr(cfg: OptimizerConfig) -> float:
    """``muon_lr``; unset, AdamW's lr when RMS-matched, else Jordan's 0.02."""
    if cfg.muon_lr is not None:
        return cfg.muon_lr
    return cfg.lr if cfg.muon_lr_adjust == "match_rms_adamw" else MUON_SPECTRAL_LR


def muon_weight_decay(cfg: OptimizerConfig) -> float:
    """``muon_weight_decay``; unset, AdamW's shrink per step (lr x weight_decay) at Muon's lr.

    torch.optim.Muon decays by lr x weight_decay with the unadjusted lr, as AdamW does, so with
    ``match_rms_adamw`` (the same lr) this is ``optimizer.weight_decay`` itself.
    """
    if cfg.muon_weight_decay is not None:
        return cfg.muon_weight_decay
    return cfg.lr * cfg.weight_decay / muon_lr(cfg)


def build_adamw(
    params: list[nn.Parameter], cfg: OptimizerConfig, warn: Callable[[str], None]
) -> tuple[torch.optim.AdamW, str]:
    groups = param_groups(params, cfg.weight_decay)
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


class MuonAdamW(torch.optim.Optimizer):
    """Muon on the hidden matrices and AdamW on the rest, as one ``torch.optim.Optimizer``.

    The param groups are the two inner optimizers' own dicts, each tagged ``kind`` ("adamw"
    or "muon"), and both inner optimizers read and write this optimizer's ``state``: whatever
    acts on a plain optimizer (an LR scheduler, GradScaler, ``state.clear()``, ``state_dict``)
    acts on both. ``load_state_dict`` refuses a state of another optimizer by name.
    """

    def __init__(self, muon: Muon, adamw: torch.optim.AdamW, split: Split):
        for group in adamw.param_groups:
            group["kind"] = "adamw"
        for group in muon.param_groups:
            group["kind"] = "muon"
        self.muon, self.adamw, self.split = muon, adamw, split
        super().__init__([*adamw.param_groups, *muon.param_groups], {})
        self._link()

    def _link(self) -> None:
        """Point the inner optimizers at this one's groups and state (again after a load)."""
        self.adamw.param_groups = [g for g in self.param_groups if g["kind"] == "adamw"]
        self.muon.param_groups = [g for g in self.param_groups if g["kind"] == "muon"]
        self.adamw.state = self.muon.state = self.state

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 (torch's signature)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.adamw.step()
        self.muon.step()
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        _refuse_other_kind(self, state_dict)
        super().load_state_dict(state_dict)
        self._link()

    def describe(self, kernel: str) -> str:
        dtype = str(self.muon.ns_dtype).removeprefix("torch.").replace("bfloat16", "bf16")
        dtype = dtype.replace("float32", "fp32")
        return f"muon ({len(self.split.muon)} matrices, {dtype}) + adamw ({kernel})"


def _kinds(groups: list[dict]) -> list[str]:
    return [g.get("kind", "adamw") for g in groups]


def _refuse_other_kind(optimizer: torch.optim.Optimizer, state_dict: dict) -> None:
    """A checkpoint's optimizer state is only for the optimizer that wrote it (one line)."""
    saved = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
    if not isinstance(saved, list) or not all(isinstance(g, dict) for g in saved):
        return  # torch's own checks word a malformed state
    mine = _kinds(optimizer.param_groups)
    if sorted(set(_kinds(saved))) != sorted(set(mine)):
        name = lambda kinds: "muon" if "muon" in kinds else "adamw"  # noqa: E731
        raise CheckpointError(
            f"the checkpoint's optimizer state is {name(_kinds(saved))}'s, this run's optimizer "
            f"is {name(mine)} (optimizer.name)",
            hint="resume with the optimizer the run was started with",
        )


def optimizer_label(optimizer: torch.optim.Optimizer, kernel: str) -> str:
    """``adamw (fused)`` or ``muon (14 matrices, bf16) + adamw (fused)``: the run's facts."""
    if isinstance(optimizer, MuonAdamW):
        return optimizer.describe(kernel)
    return f"adamw ({kernel})"


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    cfg: SchedulerConfig,
    horizon: int,
    budget: Callable[[], float] | None = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """``budget``: the share of the run's time budget spent so far (``train.clock``); None
    for a run without one, whose schedule follows the steps alone."""
    if budget is None and cfg.continue_factor is None:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg, horizon))
    factor = progress_factor(cfg, horizon, budget or _no_budget)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def lr_factor(cfg: SchedulerConfig, horizon: int) -> Callable[[int], float]:
    """Multiplier of the base lr at optimizer step ``step`` (0-based).

    With a re-warm (``rewarm_steps`` from step ``rewarm_from``) the steps from there on follow
    a schedule of their own: ``rewarm_steps`` of warmup, then the configured decay to
    ``horizon``, as a fresh run of ``horizon - rewarm_from`` steps would. A resumed run never
    asks for an earlier step, so those keep the plain curve.
    """
    plain = _curve(cfg, cfg.warmup_steps, horizon)
    start = cfg.rewarm_from
    if not cfg.rewarm_steps or start is None:
        return plain
    rewarmed = _curve(cfg, cfg.rewarm_steps, horizon - start)
    return lambda step: plain(step) if step < start else rewarmed(step - start)


def progress_factor(
    cfg: SchedulerConfig, horizon: int, budget: Callable[[], float]
) -> Callable[[int], float]:
    """Multiplier at step ``step`` of a time-budgeted run: warmup over ``warmup_steps`` steps
    (it protects the optimizer's first updates, however long they take), then the decay at the
    run's progress: the budget's share spent or ``step / horizon``, whichever is further. A
    run whose end changed on resume goes on from where it stood (``_continued``)."""
    warmup = cfg.warmup_steps

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, max(budget(), step / horizon))
        if cfg.continue_factor is not None:
            return _continued(cfg, progress)
        if cfg.name == "wsd":  # the last decay_fraction of the run decays
            start = 1.0 - cfg.decay_fraction
            return _decay(cfg, max(0.0, (progress - start) / cfg.decay_fraction))
        return _decay(cfg, progress)

    return factor


def _no_budget() -> float:
    return 0.0


def _continued(cfg: SchedulerConfig, progress: float) -> float:
    """The multiplier of a run resumed with a new end (``checkpoint.run_end``): from
    ``continue_factor`` at ``continue_progress`` down to ``min_lr_ratio`` at progress 1, by the
    schedule's shape (cosine; wsd: stable then linear while it had not begun decaying, else
    linear), so the LR never rises."""
    start, top, floor = cfg.continue_progress or 0.0, cfg.continue_factor or 0.0, cfg.min_lr_ratio
    through = 1.0 if start >= 1.0 else min(1.0, max(0.0, (progress - start) / (1.0 - start)))
    if cfg.name == "constant" or top <= floor:
        return top
    if cfg.name == "wsd" and top >= 1.0:
        stable = 1.0 - cfg.decay_fraction
        return _decay(cfg, max(0.0, (through - stable) / cfg.decay_fraction))
    if cfg.name == "wsd":
        return top - (top - floor) * through
    return floor + (top - floor) * 0.5 * (1.0 + math.cos(math.pi * through))


def _decay(cfg: SchedulerConfig, progress: float) -> float:
    """The multiplier after warmup, ``progress`` in [0, 1] through the decaying part."""
    floor = cfg.min_lr_ratio
    if cfg.name == "constant":
        return 1.0
    if cfg.name == "wsd":
        return 1.0 - (1.0 - floor) * progress
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _curve(cfg: SchedulerConfig, warmup: int, horizon: int) -> Callable[[int], float]:
    decay_start = horizon - max(1, round(cfg.decay_fraction * horizon))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.name == "wsd":
            start = max(decay_start, warmup)
            return _decay(cfg, min(1.0, max(0.0, (step - start) / max(1, horizon - start))))
        return _decay(cfg, min(1.0, (step - warmup) / max(1, horizon - warmup)))

    return factor

"""The outer optimizer of DumbDiLoCo: Nesterov SGD on pseudo-gradients, delayed for async rounds.

``OuterOptimizer`` updates the master's fp32 weights in place from a round's (scaled) mean:
``step`` is DiLoCo's Nesterov step, ``delayed_step`` the delayed Nesterov of Liu et al. 2024
that applies momentum once per inner loop of the whole fleet (``outer`` explains the policy).
Only its momentum buffers are state; lr and momentum come from the config. No I/O.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

Tensors = dict[str, Tensor]


class OuterOptimizer:
    """Nesterov SGD on pseudo-gradients, as in DiLoCo, updating fp32 weights in place.

    buf = momentum * buf + g; update = g + momentum * buf (nesterov) or buf; w -= lr * update.
    The same rule as ``torch.optim.SGD(nesterov=True)`` with a zero-initialised buffer.
    """

    def __init__(self, lr: float, momentum: float, nesterov: bool = True):
        if not lr > 0 or not 0 <= momentum < 1:
            raise ValueError(f"outer lr must be > 0 and momentum in [0, 1) (got {lr}, {momentum})")
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov
        self.buffers: Tensors = {}
        self.pending: Tensors = {}  # delayed_step's gradient sum since momentum last applied
        self.pending_share = 0.0  # ... and the part of one fleet inner loop it holds

    @torch.no_grad()
    def step(
        self, global_weights: Tensors, pseudo_grad: Tensors, *, apply_momentum: bool = True
    ) -> None:
        """One outer step; ``apply_momentum=False`` is plain SGD and leaves the buffer alone."""
        if set(pseudo_grad) != set(global_weights):
            raise ValueError("pseudo-gradient keys differ from the global weights' keys")
        for name, weight in global_weights.items():
            grad = pseudo_grad[name].to(device=weight.device, dtype=weight.dtype)
            use_buffer = apply_momentum and self.momentum > 0
            weight.sub_(self._nesterov(name, grad) if use_buffer else grad, alpha=self.lr)

    @torch.no_grad()
    def delayed_step(self, global_weights: Tensors, pseudo_grad: Tensors, share: float) -> bool:
        """Delayed Nesterov: the gradient part now, the momentum part once per fleet inner loop.

        Every call applies ``lr * g`` at once and adds ``g`` to a pending sum; once the pending
        rounds' ``share`` of the fleet adds up to one inner loop of every node, the buffer takes
        the sum (``buf = momentum * buf + sum``) and the look-ahead ``lr * momentum * buf`` is
        applied. With every node in every round this is exactly ``step``; with rounds of a few
        nodes, momentum still counts once per inner loop of the fleet, not once per round.
        Returns whether momentum was applied.
        """
        for name, weight in global_weights.items():
            weight.sub_(pseudo_grad[name].to(weight.dtype), alpha=self.lr)
        if self.momentum == 0:
            return False
        for name, grad in pseudo_grad.items():
            self.pending.setdefault(name, torch.zeros_like(grad)).add_(grad)
        self.pending_share += share
        if self.pending_share < 1.0 - 1e-9:  # float sums of 1/3 land just under 1
            return False
        for name, weight in global_weights.items():
            buf = self.buffers.setdefault(name, torch.zeros_like(weight))
            buf.mul_(self.momentum).add_(self.pending[name])
            weight.sub_(buf, alpha=self.lr * self.momentum)
        self.pending, self.pending_share = {}, 0.0
        return True

    def _nesterov(self, name: str, grad: Tensor) -> Tensor:
        buf = self.buffers.get(name)
        if buf is None:
            buf = self.buffers[name] = torch.zeros_like(grad)
        buf.mul_(self.momentum).add_(grad)
        return grad.add(buf, alpha=self.momentum) if self.nesterov else buf

    def state_dict(self) -> dict[str, Any]:
        """Momentum buffers only: lr and momentum come from the config, which may change."""
        return {"momentum_buffer": dict(self.buffers)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffers = fp32_copies(state.get("momentum_buffer", {}))


def fp32_copies(tensors: Tensors) -> Tensors:
    return {k: t.detach().to("cpu", torch.float32, copy=True) for k, t in tensors.items()}

"""Error feedback: what quantizing a node's delta dropped is added to its next delta.

A node encodes ``delta + residual``; the new residual is that sum minus what the master will
decode from the very bytes sent (``codec.decode_own_delta``), so over a run the master receives
the node's whole progress except the last residual, whatever the encoding's precision (int2
drops about a third of each delta's norm; error feedback sends it in the rounds after). The
residual is node state: part of the uploader's checkpoint state, so a resumed node sends what
it would have sent (I1). It is reset, with a logged line, when the node adopts a global it did
not build on (the repo went back: ``Ready.replaces``): the residual corrects deltas that such a
global never held. A global that is merely newer keeps it: the dropped part is still this
node's work that no global holds.
"""

from __future__ import annotations

from typing import Any

import torch

from speedtronic.distributed.codec import decode_own_delta, encode_delta
from speedtronic.distributed.protocol import DeltaHeader

Tensors = dict[str, torch.Tensor]


class ErrorFeedback:
    """The residual of one node; ``enabled`` False (or fp32, which drops nothing) keeps none."""

    def __init__(self, encoding: str, enabled: bool, log: Any):
        self.enabled = bool(enabled) and encoding != "fp32"
        self.log = log  # notice(message)
        self.residual: Tensors | None = None
        self.generation = 0  # bumped by a reset: a residual computed before it is not kept

    def encode(self, delta: Tensors, header: DeltaHeader) -> tuple[bytes, Tensors, Tensors | None]:
        """``(bytes, what they encode before quantization, the residual after them)``."""
        if not self.enabled:
            return encode_delta(delta, header), delta, None
        target = {k: v.detach().to("cpu", torch.float32, copy=True) for k, v in delta.items()}
        if self.residual is not None:
            for key, value in target.items():
                value.add_(self.residual[key])
        data = encode_delta(target, header)
        shapes = {key: tuple(value.shape) for key, value in target.items()}
        decoded = decode_own_delta(data, header.encoding, shapes)
        return data, target, {key: target[key] - decoded[key] for key in target}

    def reset(self, why: str) -> None:
        self.generation += 1
        if self.residual is not None:
            norm = sum(float(v.double().square().sum()) for v in self.residual.values()) ** 0.5
            self.log(f"diloco: error feedback residual (L2 norm {norm:.3g}) dropped: {why}")
        self.residual = None

    def state(self) -> Tensors | None:
        return None if self.residual is None else {k: v.clone() for k, v in self.residual.items()}

    def load(self, state: Tensors | None) -> None:
        self.residual = None if state is None else {k: v.cpu() for k, v in state.items()}

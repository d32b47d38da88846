"""The frozen base of a fleet that fine-tunes: its sha256, and the refusal of a node built on
another.

With ``model.lora`` only the adapters travel (deltas and globals hold the trainable parameters
alone), so every node must start from the very same frozen weights, or the adapters it trains
fit other weights than the fleet's. ``base_sha256`` fingerprints them once at start (every
frozen parameter's name, shape, dtype and bytes, in name order); the master records it in
``step_count.json`` (``base_sha256``) with every publish, and a node refuses a run whose record
differs from its own (``check_base``), before its first step when the run has a global (exit 2).
A model with no frozen parameter has no base: its master records none, as masters always did.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch
from torch import nn

from speedtronic.errors import BaseMismatch

FIELD = "base_sha256"  # its name in step_count.json


def base_sha256(model: nn.Module) -> str | None:
    """sha256 of ``model``'s frozen parameters (``requires_grad`` False), None if it has none.

    One parameter at a time on the CPU, so the peak is one tensor's copy; tied parameters
    count once (``named_parameters`` dedupes). Names, shapes and dtypes are hashed too: the
    same bytes in another layout are another base.
    """
    frozen = {name: p for name, p in model.named_parameters() if not p.requires_grad}
    if not frozen:
        return None
    digest = hashlib.sha256()
    for name in sorted(frozen):
        tensor = frozen[name].detach().to("cpu").contiguous()
        about = [name, list(tensor.shape), str(tensor.dtype).removeprefix("torch.")]
        digest.update(json.dumps(about).encode() + b"\n")
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def check_base(counted: dict[str, Any], own: str | None, where: str) -> None:
    """Refuse (``BaseMismatch``) a run whose step count records another frozen base than
    ``own``, or records one where this node has none, or none where it has one."""
    recorded = counted.get(FIELD)
    if recorded == own:
        return
    raise BaseMismatch(
        f"diloco: this node's frozen base is {_named(own)}, the run in {where} records "
        f"{_named(recorded)}: every node of a fleet that fine-tunes starts from the same base",
        hint="start every node with the same checkpoint.init_from and model.lora",
    )


def _named(sha: str | None) -> str:
    return f"sha256 {sha}" if sha else "none (every parameter trained)"

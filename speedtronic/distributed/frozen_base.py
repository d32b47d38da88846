"""The frozen base of a fleet that fine-tunes: its sha256, and the refusal of a node built on
another.

With ``model.lora`` only the adapters travel (deltas and globals hold the trainable parameters
alone), so every node must start from the very same frozen weights, or the adapters it trains
fit other weights than the fleet's. ``base_sha256`` fingerprints them once at start (the digest
``train.lora`` names a LoRA run's base by); the master records it in
``step_count.json`` (``base_sha256``) with every publish, and a node refuses a run whose record
differs from its own (``check_base``), before its first step when the run has a global (exit 2).
A model with no frozen parameter has no base: its master records none, as masters always did.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from speedtronic.errors import BaseMismatch

FIELD = "base_sha256"  # its name in step_count.json


def base_sha256(model: nn.Module) -> str | None:
    """sha256 of ``model``'s frozen weights, None if every parameter trains.

    A LoRA model's is the digest its run's start line and checkpoints name (``train.lora``:
    the base's whole state, under the plain model's names), so a refusal's hashes can be
    matched against a node's ``meta.json``; any other model's, its frozen parameters'. One
    tensor at a time on the CPU; names, shapes and dtypes count, so the same bytes in another
    layout are another base.
    """
    frozen = {name: p for name, p in model.named_parameters() if not p.requires_grad}
    if not frozen:
        return None
    from speedtronic.train import lora

    return lora.base_sha256(lora.base_state(model) if lora.is_wrapped(model) else frozen)


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


def check_recorded_base(counted: dict[str, Any], own: str | None, where: str) -> None:
    """A master's start: refuse a repo whose step count records another frozen base (the
    master restarted on other weights); one that records none gets this master's."""
    if counted.get(FIELD) is not None:
        check_base(counted, own, where)


def _named(sha: str | None) -> str:
    return f"sha256 {sha}" if sha else "none (every parameter trained)"

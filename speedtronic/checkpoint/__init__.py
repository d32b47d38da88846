"""Checkpoints: the on-disk layout, saving, loading, inspection and the run's resume policy.

``layout`` (names, listing, structural scan), ``inspection`` (``ckpt inspect``/``prune``) and
``files`` (fsync, atomic renames) are stdlib-only; ``save`` and ``load`` add torch and
safetensors; ``plugin`` is the Trainer plug-in that saves during a run and resumes it. The
public names below load lazily, so ``speedtronic ckpt inspect`` never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Checkpoint": "load",
    "find_latest": "load",
    "list_checkpoints": "load",
    "load_checkpoint": "load",
    "load_latest": "load",
    "verify_checkpoint": "load",
    "save_checkpoint": "save",
    "CheckpointPlugin": "plugin",
    "resume_run": "plugin",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value

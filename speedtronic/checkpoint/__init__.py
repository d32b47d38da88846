"""Checkpoints: the on-disk layout, saving, loading, inspection and the run's resume policy.

``layout`` (names, listing, structural scan, sha256 verification), ``inspection`` (``ckpt
inspect``/``prune``), ``files`` (fsync, atomic renames) and ``start`` (the run a directory
holds: refuse a fresh run there, or replace it) are stdlib-only; ``save`` and
``load`` add torch and safetensors; ``plugin`` is the Trainer plug-in that saves during a run
and resumes it. The public names below load lazily, so ``speedtronic ckpt inspect`` never
imports torch.
"""

from __future__ import annotations

from speedtronic.lazy import lazy_exports

_EXPORTS = {
    "Checkpoint": "load",
    "find_latest": "load",
    "list_checkpoints": "load",
    "load_checkpoint": "load",
    "load_latest": "load",
    "NoUsableCheckpointError": "load",
    "verify_checkpoint": "layout",
    "save_checkpoint": "save",
    "CheckpointPlugin": "plugin",
    "resume_run": "plugin",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)

"""Checkpoint policy of a run: when to save, what goes in, and how a run resumes.

``CheckpointPlugin`` is a Trainer plug-in: it saves every ``checkpoint.interval`` optimizer
steps and once when training ends (completed, stopped or interrupted), with ``keep_last``
retention. ``resume_run`` restores the newest good checkpoint into a built runtime and drops
metrics logged after it, so the JSONL continues without gaps or duplicates. The bytes on disk
belong to ``save`` and ``load`` beside this module.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from speedtronic.checkpoint.load import load_latest
from speedtronic.checkpoint.save import save_checkpoint
from speedtronic.errors import CheckpointError


class CheckpointPlugin:
    name = "checkpoint"

    def __init__(self, runtime: Any):
        self.runtime = runtime
        self.config = runtime.config.checkpoint
        self.root = runtime.config.checkpoint_dir
        self.run_id = uuid.uuid4().hex[:12]
        self.param_count = sum(p.numel() for p in runtime.model.parameters())
        self.saved_step: int | None = None
        self.last_path: Path | None = None

    def after_optimizer_step(self, trainer: Any) -> None:
        interval = self.config.interval
        if interval and trainer.step % interval == 0:
            self.save(trainer)

    def on_train_end(self, trainer: Any, result: Any) -> None:
        if self.saved_step != trainer.step:
            self.save(trainer)

    def save(self, trainer: Any) -> Path:
        runtime = self.runtime
        meta = {
            "run_id": self.run_id,
            "tokens": trainer.tokens,
            "samples": trainer.samples,
            "loss": trainer.current_loss(),
            "param_count": self.param_count,
            "config": runtime.config.to_dict(redact=True),
        }
        self.last_path = save_checkpoint(
            self.root,
            trainer.step,
            runtime.model.state_dict(),
            trainer.state_dict(),
            meta,
            keep_last=self.config.keep_last,
        )
        self.saved_step = trainer.step
        runtime.logger.log("checkpoint", {"step": trainer.step, "path": str(self.last_path)})
        return self.last_path


def resume_run(runtime: Any, plugin: CheckpointPlugin) -> int | None:
    """Load the newest good checkpoint into ``runtime``; return its step, or None if none."""
    logger = runtime.logger
    checkpoint = load_latest(plugin.root, log=logger.warn)
    if checkpoint is None:
        logger.notice(f"no checkpoint in {plugin.root}; starting a fresh run")
        return None
    path = checkpoint.path
    try:
        runtime.model.load_state_dict(checkpoint.model_state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(
            f"checkpoint {path} does not fit this model: {str(exc).splitlines()[0]}",
            hint="resume with the config the checkpoint was written with",
        ) from None
    runtime.trainer.load_state_dict(checkpoint.trainer_state)
    plugin.run_id = checkpoint.meta.get("run_id", plugin.run_id)
    plugin.saved_step, plugin.last_path = runtime.trainer.step, path
    logger.drop_records_after(runtime.trainer.step)
    logger.notice(f"resumed from {path} at step {runtime.trainer.step}")
    return runtime.trainer.step

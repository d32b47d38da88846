"""Checkpoint policy of a run: when to save, what goes in, and how a run resumes.

``CheckpointPlugin`` is a Trainer plug-in: it saves every ``checkpoint.interval`` optimizer
steps and once when training ends (completed, stopped, or interrupted: then before any other
plug-in's end waits), with ``keep_last`` retention. ``resume_run`` restores the newest good
checkpoint into a built runtime and drops metrics logged after it, so the JSONL continues
without gaps or duplicates; when checkpoints exist but none is usable it stops the run instead
of starting over. The bytes on disk belong to ``save`` and ``load`` beside this module.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from speedtronic.checkpoint.layout import STATE_FILE, TOKENIZER_FILE, step_dir_name
from speedtronic.checkpoint.load import Checkpoint, NoUsableCheckpointError, load_latest
from speedtronic.checkpoint.save import save_checkpoint
from speedtronic.checkpoint.tokenizer import tokenizer_record
from speedtronic.errors import CheckpointError, SpeedtronicError

# What Trainer.load_state_dict reads at the top level of the state Trainer.state_dict writes:
# key -> (rule, test). Checked before anything is restored, so that a state of the wrong
# shape counts as a damaged checkpoint (resume falls back) rather than failing half-way.
_COUNT = ("an integer >= 0", lambda v: type(v) is int and v >= 0)
_TRAINER_STATE = {
    "step": _COUNT,
    "tokens": _COUNT,
    "samples": _COUNT,
    "skipped_steps": _COUNT,
    "last_loss": ("a number or None", lambda v: v is None or type(v) in (int, float)),
    "optimizer": ("a dict", lambda v: isinstance(v, dict)),
    "scheduler": ("a dict or None", lambda v: v is None or isinstance(v, dict)),
    "scaler": ("a dict or None", lambda v: v is None or isinstance(v, dict)),
    "data": ("a dict or None", lambda v: v is None or isinstance(v, dict)),
    "rng": ("a dict", lambda v: isinstance(v, dict)),
    "plugins": ("a dict", lambda v: isinstance(v, dict)),
}
# The exceptions a state_dict of the wrong shape makes torch and the trainer raise.
_RESTORE_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError)


class CheckpointPlugin:
    name = "checkpoint"

    def __init__(self, runtime: Any):
        self.runtime = runtime
        self.config = runtime.config.checkpoint
        self.root = runtime.config.checkpoint_dir
        explicit = self.config.directory is not None
        self.key = "checkpoint.directory" if explicit else "run.output_dir"  # where errors point
        self.run_id = uuid.uuid4().hex[:12]
        self.param_count = sum(p.numel() for p in runtime.model.parameters())
        self.saved_step: int | None = None
        self.last_path: Path | None = None
        self.group: Any = (
            None  # a DDP group (speedtronic.train.parallel): rank 0 writes, others wait
        )
        # Every checkpoint records the run's tokenizer (checkpoint.tokenizer), for generate/export
        record, data = tokenizer_record(getattr(runtime, "tokenizer", None))
        self.tokenizer_meta = record
        self.extra_files = {TOKENIZER_FILE: data} if data is not None else {}

    def after_optimizer_step(self, trainer: Any) -> None:
        interval = self.config.interval
        if interval and trainer.step % interval == 0:
            self.save(trainer)

    def on_stop(self, trainer: Any, result: Any) -> None:
        """A signal stopped the run: save now, before any plug-in waits (a container's SIGKILL
        follows SIGTERM within seconds)."""
        self.on_train_end(trainer, result)

    def on_train_end(self, trainer: Any, result: Any) -> None:
        if self.saved_step != trainer.step:
            self.save(trainer)

    def on_train_error(self, trainer: Any, exc: BaseException) -> None:
        """A step failed after others completed: keep them, as Ctrl-C does (issue 31). Not
        when saving is what failed (a full disk): another try would only repeat it."""
        if isinstance(exc, CheckpointError):
            return
        path = self.last_path if self.saved_step == trainer.step else self.save(trainer)
        self.runtime.logger.notice(
            f"step {trainer.step + 1} failed ({type(exc).__name__}); the checkpoint of step "
            f"{trainer.step} is {path}: fix the cause, then continue with --resume"
        )

    def save(self, trainer: Any) -> Path:
        runtime, group = self.runtime, self.group
        state = trainer.state_dict()  # on every rank: a DDP group gathers each rank's RNG/data
        if group is not None and not group.is_main:
            group.saved()  # rank 0 writes; the others wait until the checkpoint is complete
            self.saved_step, self.last_path = trainer.step, self.root / step_dir_name(trainer.step)
            return self.last_path
        adapters = getattr(runtime, "adapters", None)  # LoRA: the adapters, not the base
        meta = {
            "run_id": self.run_id,
            "tokens": trainer.tokens,
            "samples": trainer.samples,
            "loss": trainer.current_loss(),
            "param_count": self.param_count,
            "config": runtime.config.to_dict(redact=True),
            "tokenizer": self.tokenizer_meta,
            "eval_loss": _last_eval(trainer),
            "eval_sets": _last_sets(trainer),
            **({"lora": adapters.record} if adapters is not None else {}),
        }
        weights = adapters.state(runtime.model) if adapters is not None else None
        try:
            self.last_path = save_checkpoint(
                self.root,
                trainer.step,
                runtime.model.state_dict() if weights is None else weights,
                state,
                meta,
                keep_last=self.config.keep_last,
                extra_files=self.extra_files,
            )
        except CheckpointError as exc:
            if not isinstance(exc.__cause__, OSError):
                raise
            # A full disk or a permission error: say which setting put the files there
            raise CheckpointError(f"{self.key}: {exc}", hint=exc.hint) from exc.__cause__
        self.saved_step = trainer.step
        runtime.logger.log("checkpoint", {"step": trainer.step, "path": str(self.last_path)})
        if group is not None:
            group.saved()
        return self.last_path


def _last_eval(trainer: Any) -> dict | None:
    """The newest evaluation of this process, ``{"step", "loss"}``, for the model card."""
    evals = [getattr(p, "last", None) for p in trainer.plugins if getattr(p, "name", "") == "eval"]
    last = max((e for e in evals if e is not None), default=None)
    if last is None or not math.isfinite(last[1]):
        return None
    return {"step": last[0], "loss": last[1]}


def _last_sets(trainer: Any) -> dict | None:
    """The newest figures of each ``eval.sets`` set, ``{name: {step, loss, bits_per_byte}}``."""
    found = [p.last for p in trainer.plugins if getattr(p, "name", "") == "eval_sets"]
    return dict(found[0]) if found and found[0] else None


def state_mismatch(model: dict[str, Any], saved: dict[str, Any]) -> str:
    """How a saved state dict differs from the model's, in one line ("" when it does not):
    counts of missing, unexpected and reshaped tensors, each with its first example."""
    missing = [k for k in model if k not in saved]
    unexpected = [k for k in saved if k not in model]
    reshaped = [
        f"{k} is {list(saved[k].shape)} there, {list(model[k].shape)} here"
        for k in model
        if k in saved and hasattr(saved[k], "shape") and saved[k].shape != model[k].shape
    ]
    parts = [
        f"{len(found)} {what} (e.g. {found[0]})"
        for what, found in (
            ("tensor(s) missing", missing),
            ("unexpected tensor(s)", unexpected),
            ("tensor(s) of another shape", reshaped),
        )
        if found
    ]
    return "; ".join(parts)


def find_resume_checkpoint(root: Path, log: Callable[[str], None]) -> Checkpoint | None:
    """The newest good checkpoint in ``root``, loaded; None when ``root`` holds none.

    If checkpoints exist but none is usable, this raises (listing each and why) and nothing is
    deleted: starting over is the user's decision, not a fallback.
    """
    try:
        return load_latest(root, log=log, validate=trainer_state_problem)
    except NoUsableCheckpointError as exc:
        raise NoUsableCheckpointError(exc.root, exc.skipped, _fresh_start_hint(exc.root)) from None


def resume_run(runtime: Any, plugin: CheckpointPlugin, checkpoint: Any = None) -> int | None:
    """Load the newest good checkpoint (or ``checkpoint``, already loaded) into ``runtime``;
    return its step, or None if there is none (a fresh run).

    The config's optimizer settings are applied over the checkpoint's (``reapply_config``):
    the runtime was built from the config the run goes on with (``checkpoint.changes``).
    """
    logger = runtime.logger
    if checkpoint is None:
        checkpoint = find_resume_checkpoint(plugin.root, logger.warn)
    if checkpoint is None:
        logger.notice(f"no checkpoint in {plugin.root}; starting a fresh run")
        return None
    path = checkpoint.path
    try:
        _load_weights(runtime, checkpoint)
    except RuntimeError as exc:
        why = state_mismatch(runtime.model.state_dict(), checkpoint.model_state)
        raise CheckpointError(
            f"checkpoint {path} does not fit this model: {why or str(exc).splitlines()[0]}",
            hint="resume with the config the checkpoint was written with",
        ) from None
    configured = optimizer_settings(runtime.trainer.optimizer)
    _restore_trainer(runtime.trainer, checkpoint)
    reapply_config(runtime.trainer, configured)
    plugin.run_id = checkpoint.meta["run_id"]
    plugin.saved_step, plugin.last_path = runtime.trainer.step, path
    logger.drop_records_after(runtime.trainer.step)
    logger.notice(f"resumed from {path} at step {runtime.trainer.step}")
    return runtime.trainer.step


def _load_weights(runtime: Any, checkpoint: Checkpoint) -> None:
    """The checkpoint's weights into the model; a LoRA run's are its adapters alone."""
    adapters = getattr(runtime, "adapters", None)
    if adapters is None:
        runtime.model.load_state_dict(checkpoint.model_state, strict=True)
        return
    why = adapters.load(runtime.model, checkpoint.model_state)
    if why:
        raise CheckpointError(
            f"checkpoint {checkpoint.path} does not fit this run's LoRA adapters: {why}",
            hint="resume with the config the checkpoint was written with",
        )


def optimizer_settings(optimizer: Any) -> list[dict[str, Any]]:
    """Each param group's settings as the config built them (everything but its params)."""
    return [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]


# Param-group entries that are the run's progress, not its settings: the checkpoint's stand.
# (Muon counts its own steps in its group, for the momentum warm-up: speedtronic/optim/muon.py.)
_GROUP_STATE = ("lr", "initial_lr", "muon_steps")


def reapply_config(trainer: Any, configured: list[dict[str, Any]]) -> None:
    """The config's optimizer settings over those a checkpoint restored (issue 31).

    ``Optimizer.load_state_dict`` restores each group's lr, betas, eps, weight decay and kernel
    flags from the checkpoint, and ``LambdaLR`` its base LRs, so a new ``optimizer.lr`` was
    recorded in meta.json but not applied. The schedule's position (its step) stays the
    checkpoint's; the LR is recomputed from the configured base LR at that position, exactly as
    the scheduler computes it, so an unchanged config resumes bit for bit.
    """
    groups, scheduler = trainer.optimizer.param_groups, trainer.scheduler
    for group, settings in zip(groups, configured, strict=True):
        group.update({k: v for k, v in settings.items() if k not in _GROUP_STATE})
    if scheduler is None or not hasattr(scheduler, "lr_lambdas"):  # no LambdaLR: the config's lr
        for group, settings in zip(groups, configured, strict=True):
            group["lr"] = settings["lr"]
        return
    scheduler.base_lrs = [settings.get("initial_lr", settings["lr"]) for settings in configured]
    for group, base, factor in zip(groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True):
        group["initial_lr"] = base
        group["lr"] = base * factor(scheduler.last_epoch)


def trainer_state_problem(checkpoint: Checkpoint) -> str | None:
    """What is wrong with a checkpoint's trainer state for ``Trainer.load_state_dict``, if any."""
    state = checkpoint.trainer_state
    for key, (rule, ok) in _TRAINER_STATE.items():
        if key not in state:
            return f"{STATE_FILE}: {key!r} missing"
        if not ok(state[key]):
            return f"{STATE_FILE}: {key!r} must be {rule} (got {type(state[key]).__name__})"
    return None


def _restore_trainer(trainer: Any, checkpoint: Checkpoint) -> None:
    """Restore the trainer, or stop the run: a half-restored trainer must never train on."""
    try:
        trainer.load_state_dict(checkpoint.trainer_state)
    except SpeedtronicError:
        raise  # already says what is wrong
    except _RESTORE_ERRORS as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CheckpointError(
            f"checkpoint {checkpoint.path}: {STATE_FILE} cannot be restored into this run"
            f" ({type(exc).__name__}: {reason})",
            hint="resume with the config and version the checkpoint was written with",
        ) from exc


def _fresh_start_hint(root: Path) -> str:
    return (
        f"nothing was deleted. To start fresh, move {root} away, train elsewhere with"
        " --output-dir, or run without --resume but with --overwrite (checkpoint.overwrite:"
        " true), which deletes these checkpoints first"
    )

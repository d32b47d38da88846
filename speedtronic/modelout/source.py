"""A RUN opened as its model: which checkpoint, its weights in the model it trained, its tokenizer.

RUN is a run's output directory (its newest usable checkpoint, as ``--resume`` picks it), a
checkpoints directory, or one checkpoint directory: any directory holding ``model.safetensors``
and ``meta.json``, such as a DumbDiLoCo run's final global. The model is rebuilt from the config
meta.json records (``model.name``, its parameters and imports: a checkpoint's config is trusted
like the config that trained it) and the weights loaded strictly (a LoRA run's adapters onto the
base its meta.json names, checked by sha256, then merged: ``train.lora``); the tokenizer is
the one the checkpoint records (``checkpoint.tokenizer``), or ``--tokenizer``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from speedtronic.checkpoint.layout import LATEST_FILE, META_FILE, MODEL_FILE, list_step_dirs
from speedtronic.checkpoint.load import Checkpoint, load_latest_weights, load_weights
from speedtronic.checkpoint.plugin import state_mismatch
from speedtronic.checkpoint.tokenizer import tokenizer_from_record
from speedtronic.data.tokenizer import load_tokenizer
from speedtronic.errors import CheckpointError, ConfigError, DataError
from speedtronic.registry import build_model

WHERE_HINT = (
    "pass a run's output directory, its checkpoints directory, or one checkpoint directory "
    "(model.safetensors + meta.json)"
)


@dataclass
class RunModel:
    """A checkpoint's model on the CPU in eval mode, with what it was trained with."""

    checkpoint: Path
    meta: dict[str, Any]
    config: dict[str, Any]  # the stored (redacted) config
    model: nn.Module  # a LoRA run's with its adapters merged into the base
    tokenizer: Any  # ByteTokenizer, HFTokenizer, or None: not recorded
    adapters: dict[str, Any] | None = None  # a LoRA run's adapter tensors (checkpoint names)

    @property
    def lora(self) -> dict[str, Any] | None:
        """A LoRA run's record (meta.json ``lora``: settings, targets, base source, sha256)."""
        record = self.meta.get("lora")
        return record if isinstance(record, dict) else None

    @property
    def step(self) -> int:
        return int(self.meta.get("step", 0))

    @property
    def model_name(self) -> str:
        return str(self.config["model"].get("name"))

    @property
    def precision_mode(self) -> str:
        precision = self.config.get("precision")
        mode = precision.get("mode") if isinstance(precision, dict) else None
        return mode if isinstance(mode, str) else "auto"

    @property
    def context_len(self) -> int:
        """The longest sequence the model was trained on (the data block length)."""
        data, params = self.config.get("data") or {}, self.config["model"]
        value = (data.get("seq_len") if isinstance(data, dict) else None) or params.get("seq_len")
        return int(value) if isinstance(value, int) and value > 0 else 128

    def require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise DataError(
                f"{self.checkpoint}: the checkpoint does not record its run's tokenizer (a "
                "custom tokenizer, or token files that name none)",
                hint="pass --tokenizer byte or --tokenizer PATH/tokenizer.json, the one the "
                "data was tokenized with",
            )
        return self.tokenizer


def open_run(
    run: str | Path, tokenizer: str | None = None, log: Callable[[str], None] | None = None
) -> RunModel:
    """RUN's checkpoint as a ``RunModel``; ``tokenizer`` (``byte`` or a tokenizers file)
    replaces the one the checkpoint records. A RUN that names no checkpoint is a ConfigError
    (exit 2); a damaged checkpoint, or one that does not fit its model, a CheckpointError."""
    checkpoint = find_checkpoint(Path(run), log)
    config = checkpoint.meta.get("config")
    model_section = config.get("model") if isinstance(config, dict) else None
    if not isinstance(model_section, dict) or not isinstance(model_section.get("name"), str):
        raise CheckpointError(
            f"{checkpoint.path}: meta.json records no model config (config.model.name), so the "
            "model cannot be rebuilt"
        )
    model = _load_into(rebuild(checkpoint.path, model_section), checkpoint, log)
    if tokenizer is not None:
        chosen = load_tokenizer(tokenizer)
    else:
        chosen = tokenizer_from_record(checkpoint.meta, checkpoint.path, str(checkpoint.path))
    adapters = checkpoint.model_state if "lora" in checkpoint.meta else None
    return RunModel(checkpoint.path, checkpoint.meta, config, model, chosen, adapters)


def find_checkpoint(run: Path, log: Callable[[str], None] | None = None) -> Checkpoint:
    """The weights RUN names: one checkpoint dir as it is, else the newest usable one."""
    if not run.exists():
        raise ConfigError(f"RUN: {run} does not exist", hint=WHERE_HINT)
    if not run.is_dir():
        raise ConfigError(f"RUN: {run} is not a directory", hint=WHERE_HINT)
    if (run / META_FILE).exists() or (run / MODEL_FILE).exists():
        return load_weights(run)
    root = run / "checkpoints" if (run / "checkpoints").is_dir() else run
    found = None
    if list_step_dirs(root) or (root / LATEST_FILE).exists():
        found = load_latest_weights(root, log)
    if found is None:
        raise ConfigError(f"RUN: no checkpoint in {run}", hint=WHERE_HINT)
    return found


def rebuild(where: Path, section: dict[str, Any]) -> nn.Module:
    """The model a checkpoint's config ``section`` builds, its initial weights (``where``
    names the checkpoint in errors)."""
    params = {k: v for k, v in section.items() if k not in ("name", "imports", "lora")}
    imports = section.get("imports") or []
    try:
        model = build_model(section["name"], params, list(imports))
    except ConfigError as exc:
        raise ConfigError(f"{where}: its config cannot rebuild the model: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{where}: model.name {section['name']!r} built no nn.Module")
    return model


def _load_into(
    model: nn.Module, checkpoint: Checkpoint, log: Callable[[str], None] | None
) -> nn.Module:
    """The checkpoint's weights in ``model``, in eval mode."""
    if "lora" in checkpoint.meta:  # the adapters alone: on the base it names, then merged
        from speedtronic.train import lora

        where, say = str(checkpoint.path), log or (lambda _line: None)
        lora.open_adapted(model, checkpoint.meta["lora"], checkpoint.model_state, where, say)
        return lora.merge(model).eval()
    try:
        model.load_state_dict(checkpoint.model_state, strict=True)
    except RuntimeError as exc:
        why = state_mismatch(model.state_dict(), checkpoint.model_state)
        raise CheckpointError(
            f"{checkpoint.path}: the weights do not fit the model its config builds: "
            f"{why or str(exc).splitlines()[0]}"
        ) from None
    return model.eval()

"""What ``--init-from`` starts from, and the model settings a new run takes from it.

SRC is a Speedtronic run (its output directory, its ``checkpoints/`` or one checkpoint, as
before), or a transformers model: a directory with ``config.json`` (``speedtronic export``'s
own output included) or ``hf://OWNER/NAME[@REV]``, read by ``modelout.source_model`` as
``speedtronic import`` reads it. Either way the source has a model section (the run's recorded
``model:``, or the reference transformer with the transformers config's keys) and maybe a
tokenizer file, and a tokenizer record (``checkpoint.tokenizer``'s: bytes, or the sha256 and
identity of ``tokenizer.json`` and its special tokens) that ``init_tokenizer`` holds the data
to.

A config that names no model (no ``model:`` keys) takes the source's, and one that names no
tokenizer for its text takes the source's tokenizer file. A config that names a model is held
to the source key by key (issue 35: an ``n_head`` changed with the same tensor shapes loaded
silently and trained another function, first loss 1.43-1.63 instead of 0.88): each key that
changes what the weights compute (``FUNCTION_KEYS``) and differs is an exit-2 line naming the
key and both values, unless ``checkpoint.init_overrides`` (``--init-override KEY``) lists it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedtronic.checkpoint.changes import with_value
from speedtronic.checkpoint.layout import TOKENIZER_FILE
from speedtronic.checkpoint.load import Checkpoint, load_init_weights
from speedtronic.checkpoint.tokenizer import describe, tokenizer_from_record, tokenizer_record
from speedtronic.config import SpeedtronicConfig
from speedtronic.config.sections import INIT_OVERRIDE_KEYS
from speedtronic.errors import CheckpointError, ConfigError

REFERENCE = "reference_transformer"
FUNCTION_KEYS = INIT_OVERRIDE_KEYS


@dataclass
class InitSource:
    where: str
    model: dict[str, Any]  # the source's model section: name, imports and keys
    tokenizer: Path | None  # its tokenizers file, if it has one
    load: Callable[[], Checkpoint]  # its weights, in the reference names
    record: dict | None = None  # its tokenizer (checkpoint.tokenizer's record), None: unknown


def open_init_source(src: str, log: Callable[[str], None]) -> InitSource:
    """SRC's model section, tokenizer and (lazily for a transformers model) weights."""
    from speedtronic.modelout.source_model import is_model_source

    if is_model_source(src):
        return _model_source(src, log)
    checkpoint = load_init_weights(src, log)
    if "lora" in checkpoint.meta:  # its weights are adapters: a model needs them merged
        raise ConfigError(
            f"checkpoint.init_from: {checkpoint.path} is a LoRA run's checkpoint (adapters "
            f"only); export it merged (speedtronic export {src} OUT) and start from OUT"
        )
    config = checkpoint.meta.get("config")
    section = config.get("model") if isinstance(config, dict) else None
    known = _known_record(checkpoint)
    kind = known.get("kind") if known is not None else None
    tokenizer = checkpoint.path / TOKENIZER_FILE if kind == "tokenizers" else None
    model = dict(section) if isinstance(section, dict) else {}
    return InitSource(str(checkpoint.path), model, tokenizer, lambda: checkpoint, known)


def _known_record(checkpoint: Checkpoint) -> dict | None:
    """The checkpoint's tokenizer record; one written before identities (issue 53 item 9)
    gets its file's, read back as ``generate`` reads it (a file that is not the one recorded
    leaves the record as it is: only the same bytes then match)."""
    record = checkpoint.meta.get("tokenizer")
    if not isinstance(record, dict) or record.get("kind") != "tokenizers":
        return record if isinstance(record, dict) else None
    if record.get("identity"):
        return record
    try:
        found = tokenizer_from_record(checkpoint.meta, checkpoint.path, str(checkpoint.path))
    except (CheckpointError, ConfigError):  # ConfigError: no tokenizers package
        return record
    return tokenizer_record(found)[0] or record


def _model_source(src: str, log: Callable[[str], None]) -> InitSource:
    from speedtronic.modelout.source_model import load_state, open_source

    source = open_source(src, log)

    def load() -> Checkpoint:
        meta = {"step": 0, "source": source.origin}
        return Checkpoint(source.folder, load_state(source), {}, meta)

    record = tokenizer_record(source.tokenizer)[0] if source.tokenizer is not None else None
    return InitSource(source.origin, source.model_section(), source.tokenizer_path, load, record)


def init_config(
    config: SpeedtronicConfig, log: Callable[[str], None]
) -> tuple[SpeedtronicConfig, InitSource | None]:
    """The config a fresh run with ``checkpoint.init_from`` trains, and its source: the source's
    model and tokenizer where the config names none, its model keys checked (as ``plan_start``
    does before building anything); ``config`` and None without one. For ``validate``, and for
    Python that builds parts of a run itself (``build_dataloader`` needs the source's
    vocabulary)."""
    if not config.checkpoint.init_from:
        return config, None
    source = open_init_source(config.checkpoint.init_from, log)
    from speedtronic.train.init_tokenizer import check_tokenizer

    config = adopt(config, source, [])
    check_same_function(config, source)
    check_tokenizer(config, source, log)
    return config, source


def names_no_model(config: SpeedtronicConfig) -> bool:
    spec = config.model
    return spec.name == REFERENCE and not spec.params and not spec.imports


def adopt(
    config: SpeedtronicConfig, source: InitSource, notices: list[str], own_model: bool = False
) -> SpeedtronicConfig:
    """``config`` with the source's model and tokenizer where it names none; else checked.
    ``own_model``: the caller passes the model itself (its shapes are checked, not its keys)."""
    if not own_model and names_no_model(config):
        raw = config.to_dict(redact=False)
        theirs = {k: v for k, v in source.model.items() if k != "lora"}  # adapters: ours alone
        lora = raw["model"].get("lora")
        raw["model"] = {"imports": [], **theirs, **({"lora": lora} if lora else {})}
        config = type(config).from_dict(raw)
        notices.append(
            f"checkpoint.init_from: the model settings are {source.where}'s; its tokenizer is "
            f"{describe(source.record)}"
        )
    tokenizer = source.tokenizer
    data = config.data
    if tokenizer is not None and data.tokenizer == "byte" and data.resolved_source == "text":
        config = with_value(config, "data.tokenizer", str(tokenizer))
        notices.append(f"checkpoint.init_from: data.tokenizer is {source.where}'s: {tokenizer}")
    return config


def check_same_function(config: SpeedtronicConfig, source: InitSource, misfit: str = "") -> None:
    """Refuse a model key set away from the source's (see the module docstring); ``misfit``
    says how the weights do not fit the model, when they do not."""
    theirs_name = source.model.get("name")
    if config.model.name != REFERENCE or theirs_name != REFERENCE:
        return  # another model's keys mean what its factory makes of them: shapes are checked
    ours, theirs = _resolved(config.model.params), _resolved(_keys(source.model))
    allowed = set(config.checkpoint.init_overrides)
    for key in FUNCTION_KEYS:
        if ours[key] != theirs[key] and key not in allowed:
            # an override cannot make tensors of another shape fit: offer it only where they do
            keep = "" if misfit else f", or keep {ours[key]!r} with --init-override {key}"
            raise ConfigError(
                f"checkpoint.init_from: model.{key} is {ours[key]!r} here and {theirs[key]!r} "
                f"in {source.where}: the weights would compute another function"
                f"{f' (it does not fit this model: {misfit})' if misfit else ''}; set "
                f"model.{key}: {theirs[key]!r} (or name no model to take the source's){keep}",
            )


def _keys(section: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in section.items() if k not in ("name", "imports", "lora")}


def _resolved(params: dict[str, Any]) -> dict[str, Any]:
    """Every FUNCTION_KEYS value with its default applied (None n_kv_head is n_head, ...)."""
    from speedtronic.registry import reference_config

    config = reference_config(params)
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    values.update(n_kv_head=config.kv_heads, mlp_hidden=config.mlp_dim)
    return values

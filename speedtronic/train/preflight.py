"""What a run checks before it touches its output directory, and what it starts from.

Issue 31: ``--overwrite`` deleted the old run first and only then found the new config's typo
(``n_layers``), a missing ``text_path`` or an ``n_head`` that does not divide ``d_model``,
leaving neither run; and the refusal of a directory holding a run hid such a typo behind a
suggestion to use ``--overwrite``. ``plan_start`` runs before either, and raises the first
problem a run could meet before its first step:

- ``--resume``: the checkpoint it continues is loaded, and the new config reconciled with the
  one it recorded (``checkpoint.changes``: applied, or refused with the way to do it);
- the model's configuration: the reference model's from its keys alone, any other model built
  on the meta device (allocating nothing), or for real when it cannot be (the RNG untouched);
- the data: the datasets are built (files exist, are regular, UTF-8 all through, token ids
  fit the vocabulary), and handed on to ``build_runtime`` so nothing is read twice;
- ``--init-from``: the source (a run or a transformers model, ``init_source``) gives its model
  and tokenizer to a config that names none, or is held to the config's model keys; the data's
  tokenizer is held to the source's (``init_tokenizer``); its weights are loaded and their
  shapes checked against the model's;
- a packed chat folder (``doc_ids`` in its batches) with a model whose forward cannot take
  them (``check_takes_doc_ids``, called by ``build_runtime`` once the model is built).

Facts for the start-up lines are collected too (``notices``, ``warnings``): the DataLoader
workers clamped to this machine's cores (``data.num_workers``; only where the batches stay the
same), a model vocabulary far above what the data uses.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import IterableDataset

from speedtronic.checkpoint.changes import reconcile, with_value
from speedtronic.checkpoint.load import Checkpoint
from speedtronic.checkpoint.plugin import find_resume_checkpoint, state_mismatch
from speedtronic.checkpoint.start import held_run
from speedtronic.config import SpeedtronicConfig
from speedtronic.data import build_datasets
from speedtronic.data.describe import vocab_warning
from speedtronic.errors import ConfigError
from speedtronic.registry import build_model, reference_config
from speedtronic.train.init_source import (
    InitSource,
    adopt,
    check_same_function,
    names_no_model,
    open_init_source,
)
from speedtronic.train.init_tokenizer import check_tokenizer


@dataclass
class StartPlan:
    """What ``plan_start`` checked and prepared, for ``build_runtime`` and the start-up lines."""

    config: SpeedtronicConfig  # the config to run: --resume and the worker clamp may adjust it
    datasets: tuple[Any, Any] | None = None  # (train, held-out or None) from config.data
    resume: Checkpoint | None = None  # the checkpoint --resume continues, loaded
    init: Checkpoint | None = None  # the weights --init-from starts from (trainer state empty)
    notices: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    eval_sets: list[Any] = field(default_factory=list)  # eval.sets, read (evaluate.sets)
    specials: dict | None = None  # the init source's special tokens, its tokenizer the data's
    # model.lora: where the frozen base comes from (the --init-from as given), and on --resume
    # the sha256 its weights must have (the checkpoint's meta.json "lora" record)
    base_source: str | None = None
    base_sha256: str | None = None


def plan_start(
    config: SpeedtronicConfig,
    model: nn.Module | None = None,
    dataset: Any = None,
    tokenizer: Any = None,
    resume: bool = True,
) -> StartPlan:
    """Check everything that can be checked before the first step; raise the first problem.

    ``model`` / ``dataset`` are the caller's own (then only their shapes and type are used);
    ``resume=False`` leaves ``checkpoint.resume`` to the caller (``build_runtime`` alone).
    """
    plan = StartPlan(config)
    plan.config = clamp_workers(config, dataset, plan.notices)
    if resume and config.checkpoint.resume:
        _plan_resume(plan)
    config = plan.config
    init = config.checkpoint.init_from if plan.resume is None else None
    if config.model.lora is not None:
        init = _lora_base(plan, init)
    source = None
    if init is not None:  # before the model and data: a config naming none takes the source's
        source = open_init_source(init, plan.warnings.append)
        config = plan.config = adopt(config, source, plan.notices, own_model=model is not None)
        if dataset is None and tokenizer is None:  # a caller's own data names no tokenizer
            plan.specials = check_tokenizer(config, source, plan.warnings.append)
    shapes = model
    if model is None:  # another model is built only where a run could be lost: see check_model
        shapes = check_model(config, build=init is not None, others=_run_at_stake(config))
    plan.datasets = build_datasets(config, tokenizer) if dataset is None else None
    plan.eval_sets = _eval_sets(config, tokenizer)
    if source is not None:
        plan.init = _load_init(config, source, shapes, own_model=model is not None)
    plan.warnings += [w for w in [vocab_warning(config)] if w and dataset is None]
    return plan


def coordinator_model(config: SpeedtronicConfig, logger: Any) -> tuple[Any, nn.Module, Any]:
    """A coordinating master's config, model and adapters (``plan_coordinator``): its first
    global is what every worker starts from."""
    plan = plan_coordinator(config)
    for message in plan.warnings:
        logger.warn(message)
    config = plan.config
    model = build_model(config.model.name, config.model.params, config.model.imports)
    return config, model, load_start_weights(model, plan, logger.notice)


def plan_coordinator(config: SpeedtronicConfig) -> StartPlan:
    """What a DumbDiLoCo master that does not train starts from: the weights every worker
    starts from (--init-from's, a LoRA run's base), checked as ``plan_start`` checks them, and
    no data, which it never reads. Its first global is these weights: random ones in their
    place would send a fleet that fine-tunes back to scratch."""
    plan = StartPlan(config)
    init = config.checkpoint.init_from
    if config.model.lora is not None:
        init = _lora_base(plan, init)
    if init is None:
        return plan
    source = open_init_source(init, plan.warnings.append)
    config = plan.config = adopt(config, source, plan.notices)
    plan.init = _load_init(config, source, check_model(config, build=True), own_model=False)
    return plan


def _lora_base(plan: StartPlan, init: str | None) -> str:
    """The base a LoRA run adapts: --init-from's for a fresh run; on --resume the one its
    checkpoint names (or --init-from's, when the base has moved), to be checked by sha256."""
    config = plan.config
    if plan.resume is None:
        if not init:
            raise ConfigError(
                "model.lora: needs --init-from (checkpoint.init_from): LoRA trains adapters on "
                "a trained model's frozen weights; name the run or transformers model to adapt"
            )
        plan.base_source = _as_given(init)
        return init
    record = plan.resume.meta.get("lora")
    base = record.get("base") if isinstance(record, dict) else None
    if not isinstance(base, dict) or not isinstance(base.get("sha256"), str):
        raise ConfigError(
            f"--resume: {plan.resume.path} is not a LoRA checkpoint (meta.json records no "
            "lora.base), but model.lora is set; resume with the config the run was written with"
        )
    plan.base_source = _as_given(config.checkpoint.init_from or str(base.get("source")))
    plan.base_sha256 = base["sha256"]
    plan.notices[-1:] = [n for n in plan.notices[-1:] if "init_from: not used" not in n]
    return plan.base_source


def _as_given(where: str) -> str:
    """A local path made absolute (a resume may run from elsewhere); hf://... as it is."""
    path = Path(where)
    return str(path.resolve()) if "://" not in where and path.exists() else where


def load_start_weights(model: nn.Module, start: StartPlan, notice: Callable[[str], None]) -> Any:
    """--init-from's weights into ``model`` (checked against its shapes by ``plan_start``), and
    with ``model.lora`` the adapters on them: ``train.lora.Adapters``, else None."""
    if start.init is not None:
        model.load_state_dict(start.init.model_state, strict=True)
        if start.base_sha256 is None:  # a resumed LoRA run's base is named by adapt_run
            notice(
                f"checkpoint.init_from: the weights of {start.init.path} (step "
                f"{start.init.meta.get('step', '?')}); the optimizer, schedule, step count and "
                "random streams start fresh"
            )
    lora = start.config.model.lora
    if lora is None:
        return None
    from speedtronic.train.lora import adapt_run

    if start.init is None or start.base_source is None:  # plan_start loads a LoRA run's base
        raise ConfigError("model.lora: needs --init-from (checkpoint.init_from)")
    return adapt_run(model, lora, start.base_source, start.base_sha256, notice)


def _eval_sets(config: SpeedtronicConfig, tokenizer: Any) -> list[Any]:
    if not config.eval.sets:
        return []
    from speedtronic.data.manifest import data_tokenizer
    from speedtronic.evaluate.sets import load_sets

    return load_sets(config, tokenizer if tokenizer is not None else data_tokenizer(config))


def _plan_resume(plan: StartPlan) -> None:
    config = plan.config
    plan.resume = find_resume_checkpoint(config.checkpoint_dir, plan.warnings.append)
    if plan.resume is None:
        _no_rewarm(config, f"no checkpoint in {config.checkpoint_dir}")
        plan.notices.append(f"no checkpoint in {config.checkpoint_dir}; starting a fresh run")
        return
    step = plan.resume.trainer_state["step"]
    saved = plan.resume.meta.get("config")
    config = _saved_model(config, saved)
    seconds, factor = _stand(plan.resume.trainer_state)
    plan.config, notes = reconcile(saved, config, step, str(plan.resume.path), seconds, factor)
    _no_rewarm(plan.config, f"the checkpoint {plan.resume.path} records no config")
    plan.notices += notes
    if config.checkpoint.init_from:
        plan.notices.append(
            f"checkpoint.init_from: not used: the run resumes from its checkpoint at step {step}"
        )


def _saved_model(config: SpeedtronicConfig, saved: Any) -> SpeedtronicConfig:
    """A config that names no model resumes the one its checkpoint recorded (``--init-from``
    gave it the source's, key by key: each would read as changed to null); its ``model.lora``
    stays its own, so that a changed setting is still refused."""
    section = saved.get("model") if isinstance(saved, dict) else None
    if not isinstance(section, dict) or not names_no_model(config):
        return config
    raw = config.to_dict(redact=False)
    lora = raw["model"].get("lora")
    raw["model"] = {k: v for k, v in section.items() if k != "lora"}
    raw["model"].update({"lora": lora} if lora is not None else {})
    return type(config).from_dict(raw)


def _stand(state: dict[str, Any]) -> tuple[float, float | None]:
    """The checkpoint's training seconds (its clock's) and LR as a share of the base LR (its
    scheduler's); 0 and None where it saved none."""
    clock = (state.get("plugins") or {}).get("clock") or {}
    seconds = clock.get("train_seconds", 0.0)
    sched = state.get("scheduler") or {}
    last, base = sched.get("_last_lr"), sched.get("base_lrs")
    try:
        factor = float(last[0]) / float(base[0])
    except (TypeError, IndexError, ValueError, ZeroDivisionError):
        factor = None
    return float(seconds) if isinstance(seconds, (int, float)) else 0.0, factor


def _no_rewarm(config: SpeedtronicConfig, why: str) -> None:
    """A re-warm asked for that no checkpoint could start: refused, never silently dropped."""
    sched = config.scheduler
    if sched.rewarm_steps and sched.rewarm_from is None:
        raise ConfigError(
            f"scheduler.rewarm_steps: {why} to re-warm from (got {sched.rewarm_steps})",
            hint="resume a run that saved a checkpoint, or drop --rewarm to start fresh",
        )


def check_model(
    config: SpeedtronicConfig, build: bool = False, others: bool = True
) -> nn.Module | None:
    """The model's config errors, and with ``build`` the model, on the meta device where it
    can be built there: its shapes without the memory.

    The reference model's keys are checked without building it. Another model is built only
    with ``build`` or ``others``: ``plan_start`` asks for it where a run is at stake (a
    directory holding one); elsewhere the real build reports the same errors with nothing to
    lose, and a large model is not built twice.
    """
    spec = config.model
    if spec.name == "reference_transformer" and not spec.imports and not build:
        reference_config(spec.params)
        return None
    if not build and not others:
        return None
    try:
        with torch.device("meta"):
            return build_model(spec.name, spec.params, spec.imports)
    except ConfigError:
        raise
    except Exception:  # a factory the meta device cannot run: build it, leaving the RNG as it was
        with torch.random.fork_rng(devices=[]):
            return build_model(spec.name, spec.params, spec.imports)


def _run_at_stake(config: SpeedtronicConfig) -> bool:
    """Whether starting could delete a run (--overwrite) or refuse one (the directory holds it)."""
    return not config.checkpoint.resume and held_run(config.checkpoint_dir) is not None


def clamp_workers(config: SpeedtronicConfig, dataset: Any, notices: list[str]) -> SpeedtronicConfig:
    """``data.num_workers`` cut to this machine's cores, where that leaves the batches as they
    are: a map-style source is read by index, whoever reads it. A streamed source deals its
    segments out by worker, so its count stays (with a warning of our own words instead of
    PyTorch's: ``worker_warning``)."""
    workers, cores = config.data.num_workers, cpu_cores()
    if workers <= cores or _streamed(config, dataset):
        return config
    notices.append(
        f"data.num_workers: {workers} workers for {cores} CPU cores; using {cores} (the batches "
        "are the same; more workers than cores only compete with training)"
    )
    return with_value(config, "data.num_workers", cores)


def worker_warning(config: SpeedtronicConfig, dataset: Any) -> str | None:
    """The one line for a streamed source with more workers than cores (not clamped)."""
    workers, cores = config.data.num_workers, cpu_cores()
    if workers <= cores or not _streamed(config, dataset):
        return None
    return (
        f"data.num_workers: {workers} workers for {cores} CPU cores: they compete with training "
        "(a streamed source keeps its count, which sets its data order)"
    )


def cpu_cores() -> int:
    """The cores this process may run on (what PyTorch's DataLoader compares with)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on macOS or Windows
        return os.cpu_count() or 1


def _streamed(config: SpeedtronicConfig, dataset: Any) -> bool:
    if dataset is not None:
        return isinstance(dataset, IterableDataset)
    data = config.data
    return data.resolved_source == "text" and data.tokenizer != "byte"


def _load_init(
    config: SpeedtronicConfig, source: InitSource, model: nn.Module | None, own_model: bool
) -> Checkpoint:
    """``checkpoint.init_from``'s weights, refused unless they fit the model exactly."""
    where = config.checkpoint.init_from or source.where
    if config.checkpoint.overwrite and _inside(Path(where), config.checkpoint_dir):
        raise ConfigError(
            f"checkpoint.init_from: {where} overlaps {config.checkpoint_dir}, which --overwrite "
            "deletes; copy that checkpoint elsewhere first, or train into another --output-dir"
        )
    weights = source.load()
    assert model is not None  # check_model(build=True) or the caller's model
    why = state_mismatch(model.state_dict(), weights.model_state)
    if own_model is False:
        check_same_function(config, source, why)  # the key, both values, and how it misfits
    if why:
        raise ConfigError(
            f"checkpoint.init_from: {weights.path} does not fit this model: {why}",
            hint="a new run from these weights needs the model settings of the run that wrote "
            'them (its meta.json "config")',
        )
    return weights


def _inside(path: Path, folder: Path) -> bool:
    path, folder = path.resolve(), folder.resolve()
    return path == folder or path.is_relative_to(folder) or folder.is_relative_to(path)


def check_takes_doc_ids(model: nn.Module, datasets: tuple[Any, ...]) -> None:
    """A packed chat folder's samples carry ``doc_ids`` (data.shards.ChatShardBlocks), which the
    trainer passes to the model as a keyword: one whose forward cannot take it is told now."""
    packed = [d for d in datasets if getattr(d, "packed", False)]
    if not packed:
        return
    params = inspect.signature(model.forward).parameters.values()
    if any(p.name == "doc_ids" or p.kind is p.VAR_KEYWORD for p in params):
        return
    raise ConfigError(
        f"data.token_path: {packed[0].name} packs several conversations into each example, so "
        f"its batches carry doc_ids (the conversation of each position), but "
        f"{type(model).__name__}.forward takes no doc_ids; accept it (attention within each "
        "conversation, RoPE positions restarting at its start) or tokenize again with --pad"
    )

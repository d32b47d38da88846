"""The one place where a config becomes objects: model, data, optimizer, schedule, precision,
metrics and the Trainer. ``build_runtime`` assembles; ``train_from_config`` runs.
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from speedtronic.checkpoint.plugin import CheckpointPlugin, resume_run
from speedtronic.checkpoint.start import check_fresh_start, clear_checkpoints, held_run
from speedtronic.config import SpeedtronicConfig
from speedtronic.data import DataStream, build_dataloader, build_eval_loader
from speedtronic.data.describe import blocks_of, source_line
from speedtronic.data.loader import bytes_per_token, run_tokenizer
from speedtronic.errors import ConfigError, OutputError
from speedtronic.evaluate.loss_plugin import EvalPlugin
from speedtronic.observe import running as run_marker
from speedtronic.observe.metrics import MetricLogger
from speedtronic.observe.summary import (
    SUMMARY_FILE,
    RunRecord,
    coordinator_summary,
    now_iso,
    store_summary,
    summarize_run,
)
from speedtronic.optim.build import build_optimizer, build_scheduler, optimizer_label
from speedtronic.registry import build_model, import_object
from speedtronic.train import clock as run_clock
from speedtronic.train import parallel, preflight
from speedtronic.train.clock import RunClock
from speedtronic.train.precision import (
    Precision,
    emulation_warning,
    resolve_device,
    resolve_precision,
)
from speedtronic.train.preflight import (
    StartPlan,
    coordinator_model,
    load_start_weights,
    plan_start,
    worker_warning,
)
from speedtronic.train.threads import CpuShareNotice, use_threads
from speedtronic.train.trainer import Trainer, TrainerOptions, TrainResult


@dataclass
class Runtime:
    config: SpeedtronicConfig
    model: nn.Module
    optimizer: torch.optim.Optimizer
    optimizer_kernel: str
    scheduler: Any
    precision: Precision
    data: DataStream
    logger: MetricLogger
    trainer: Trainer
    checkpoints: CheckpointPlugin | None = None
    # What the run's data was tokenized with (data.loader.run_tokenizer): ByteTokenizer, an
    # HFTokenizer (.path: its tokenizer.json) or None when unknown; checkpoints record it.
    tokenizer: Any = None
    clock: RunClock | None = None  # training and start-up seconds, the time budget
    # model.lora: the adapters (train.lora.Adapters): checkpoints hold them, not the base
    adapters: Any = None
    record: RunRecord | None = None  # the curves of the run's summary

    def facts(self) -> dict[str, Any]:
        """The run_start payload: what a user wants to see before the first step."""
        cfg = self.config
        return {
            "name": cfg.run.name,
            "model": cfg.model.name,
            "params": count_parameters(self.model),
            "device": str(self.precision.device),
            "precision": self.precision.mode,
            "optimizer": optimizer_label(self.optimizer, self.optimizer_kernel),
            "max_steps": cfg.run.max_steps,
            "batch_size": cfg.batch_size,
            "micro_batch_size": cfg.data.micro_batch_size,
            "accumulation_steps": cfg.accumulation_steps,
            "seq_len": cfg.seq_len,
            "tokens_per_step": cfg.tokens_per_step,
            "output_dir": str(cfg.output_dir),
            "data": source_line(cfg, blocks_of(getattr(self.data.loader, "dataset", None))),
            "compile": cfg.compile,
            **({"world_size": cfg.world_size} if cfg.world_size > 1 else {}),
        }


def build_runtime(
    config: Any,
    model: nn.Module | None = None,
    dataset: Any = None,
    tokenizer: Callable[[str], list[int]] | None = None,
    hooks: list[Any] | None = None,
    console: bool = True,
    plugins: list[Any] | None = None,
    start: StartPlan | None = None,
) -> Runtime:
    """Assemble everything a run needs. ``model``/``dataset`` replace the configured ones;
    ``hooks`` receive metric events; ``plugins`` are Trainer plug-ins (see ``Trainer``).
    ``start`` is what ``plan_start`` checked and built (``train_from_config`` plans before it
    touches the output directory); without it the runtime plans itself, resume aside."""
    config = SpeedtronicConfig.load(config)
    check_seq_len(config)
    start = start or plan_start(config, model, dataset, tokenizer, resume=False)
    config = start.config
    use_threads(config.run.threads)  # before anything computes: the model's init too
    seed_everything(config.run.seed)  # the same on every DDP rank: the same initial weights
    world = parallel.world_from_env()
    logger = run_logger(config, console, hooks)
    for message in start.warnings:
        logger.warn(message)
    for message in start.notices:
        logger.notice(message)
    device = resolve_device(config.run.device)
    if world.active:
        device = parallel.start_group(world, device, config.run.group_timeout_s)
    precision = resolve_precision(config.precision.mode, device, logger.warn)
    emulated = emulation_warning(device, precision.mode)  # once per run: the probe is cached
    if emulated:
        logger.warn(emulated)
    if model is None:
        model = build_model(config.model.name, config.model.params, config.model.imports)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model.name: {config.model.name!r} did not build an nn.Module")
    adapters = load_start_weights(model, start, logger.notice)  # --init-from, model.lora
    model.to(device)
    if config.gradient_checkpointing:
        _enable_checkpointing(model, logger)
    optimizer, kernel = build_optimizer(model, config.optimizer, logger.warn)
    clock = RunClock(config.run.time_budget_s)
    clock.milestones = run_clock.milestones(config)
    budget = clock.progress if config.run.time_budget_s else None
    scheduler = build_scheduler(optimizer, config.scheduler, config.schedule_steps, budget)
    datasets = start.datasets or (dataset, None)
    preflight.check_takes_doc_ids(model, datasets)
    run_tok = run_tokenizer(config, datasets[0], tokenizer, from_config=dataset is None)
    if start.specials is not None and run_tok is not None:  # recorded, for export (issue 48)
        run_tok.specials = start.specials
    data, evaluation = _build_data(config, datasets, device, logger, world)
    evaluation += _held_out_sets(config, start.eval_sets, world)
    plugins = [*evaluation, *(plugins or [])]
    options = TrainerOptions(
        max_steps=config.run.max_steps,
        accumulation_steps=config.accumulation_steps,
        grad_clip=config.optimizer.grad_clip,
        log_every=config.logging.every_steps,
        compile=config.compile,
        flops_per_token=flops_per_token(model, config.seq_len),
        handle_signals=not world.active,  # a group stops on an agreed step (GroupHooks)
        flush_denormal=config.precision.flush_denormal,
    )
    if config.distributed.enabled and world.active:  # one node = one DDP group
        plugins += parallel.node_plugins(config, world, model, device, logger, run_tok, adapters)
    elif config.distributed.enabled:  # DumbDiLoCo joins as plug-ins, before the checkpoint one
        from speedtronic.distributed.setup import coordinator_plugins

        plugins += coordinator_plugins(config, model, logger, run_tok, adapters)
    find_unused = config.run.find_unused_parameters
    trained = parallel.wrap_model(model, device, find_unused) if world.active else model
    trainer = Trainer(trained, optimizer, data, precision, options, scheduler, logger, plugins)
    runtime = Runtime(config, model, optimizer, kernel, scheduler, precision, data, logger, trainer)
    runtime.adapters = adapters
    runtime.tokenizer, runtime.clock, runtime.record = run_tok, clock, RunRecord(clock)
    trainer.plugins.insert(0, clock)  # first: the others see a spent budget's last step
    trainer.plugins.append(runtime.record)
    if device.type == "cpu":  # a busy machine's cores: named once, with the remedy
        trainer.plugins.append(CpuShareNotice(logger.notice))
    logger.add_hook(runtime.record)
    runtime.checkpoints = CheckpointPlugin(runtime)
    trainer.plugins.append(runtime.checkpoints)
    if world.active:
        runtime.checkpoints.group = parallel.attach(trainer, world, logger)
    else:  # a DDP group's checkpoint resumes here too
        trainer.plugins.append(parallel.FromGroup(data, logger))
    return runtime


def _build_data(
    config: SpeedtronicConfig,
    datasets: tuple[Any, Any],
    device: torch.device,
    logger: MetricLogger,
    world: parallel.World,
) -> tuple[DataStream, list[EvalPlugin]]:
    """The training stream (this rank's share), and the evaluation plug-in when a held-out
    set is configured."""
    train_set, eval_set = datasets
    crowded = worker_warning(config, train_set)
    if crowded:
        logger.warn(crowded)
    shard = (world.rank, world.size)
    loader = build_dataloader(config, dataset=train_set, device=device, shard=shard)
    data = DataStream(loader, log=logger.notice)
    if eval_set is None:
        return data, []
    eval_loader = build_eval_loader(config, eval_set, device)
    every, batches = config.data.eval_every, config.data.eval_batches  # 0: at the end only
    reduce = parallel.sum_across if world.active else None
    tokens = batches * config.data.micro_batch_size * config.seq_len
    per_token = bytes_per_token(eval_set, tokens)
    return data, [EvalPlugin(eval_loader, every, batches, shard, reduce, per_token)]


def _held_out_sets(config: SpeedtronicConfig, sets: list[Any], world: parallel.World) -> list:
    """The plug-in that scores ``eval.sets`` at the eval cadence, when there are any."""
    if not sets:
        return []
    from speedtronic.evaluate.plugin import HeldOutSetsPlugin

    every = config.eval.every or config.data.eval_every
    batch = config.eval.batch_size or config.data.micro_batch_size
    reduce = parallel.sum_across if world.active else None
    shard = (world.rank, world.size)
    return [HeldOutSetsPlugin(sets, every, config.seq_len, batch, shard, reduce)]


def train_from_config(config: Any, **kwargs: Any) -> TrainResult:
    """Build the runtime for ``config`` (object, dict, path or YAML) and train to max_steps."""
    config = SpeedtronicConfig.load(config)
    if config.distributed.enabled and not config.distributed.train_locally:
        return coordinate_only(config, kwargs.get("hooks"), kwargs.get("console", True))
    try:
        return _train(config, **kwargs)
    except BaseException as exc:
        if parallel.owns_group():  # a failed rank's traceback would keep the wrapper alive
            _clear_locals(exc)
        raise
    finally:
        # _train's frame is gone: only reference cycles still hold the DDP wrapper, and through
        # it the group, which end_group frees while the interpreter is whole
        parallel.end_group()


def _clear_locals(exc: BaseException | None) -> None:
    """Drop the locals of the frames in ``exc``'s tracebacks and its causes' (the lines stay)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__


def _train(config: SpeedtronicConfig, **kwargs: Any) -> TrainResult:
    began = run_clock.now()  # start-up, apart from the training seconds (train/clock.py)
    # Everything that can fail before the first step fails here, before the output directory
    # is touched: --overwrite must never delete the old run for a typo in the new (issue 31),
    # nor a live run's files, whatever the flags (issue 53). Rank 0 alone: it is the one that
    # writes checkpoints and the marker, and the others must not race it.
    main = parallel.is_main_process()
    if main:
        run_marker.check_free(config.output_dir)
    check_seq_len(config)
    given = {k: kwargs.get(k) for k in ("model", "dataset", "tokenizer")}
    start = plan_start(config, **given)
    running = run_marker.claim(start.config.output_dir) if main else None
    try:
        return _run(start, began, **kwargs)
    finally:
        run_marker.release(running)


def _run(start: StartPlan, began: float, **kwargs: Any) -> TrainResult:
    """Train the run ``start`` planned, in an output directory this process has claimed."""
    config = start.config
    cleared = prepare_output(config) if parallel.is_main_process() else None
    runtime = build_runtime(config, start=start, **kwargs)
    trainer, logger = runtime.trainer, runtime.logger
    runtime.clock.began = began
    try:
        if cleared:
            logger.notice(cleared)
        if start.resume is not None:
            resume_run(runtime, runtime.checkpoints, start.resume)
            runtime.clock.end_if_spent(trainer)  # a budget spent already: nothing to train
        logger.log("run_start", runtime.facts())
        if trainer.step >= trainer.options.max_steps:
            then = "ending the DumbDiLoCo run" if config.distributed.enabled else "nothing to do"
            logger.notice(
                f"already at step {trainer.step} of max_steps {trainer.options.max_steps}; {then}"
            )
        try:
            result = trainer.fit()
        except RuntimeError as exc:
            explained = parallel.explain(exc)
            if explained is None:
                raise
            raise explained from exc
        last = runtime.checkpoints.last_path
        result.checkpoint = str(last) if last else None
        logger.log("run_end", {k: v for k, v in result.__dict__.items() if k != "summary"})
        result.summary = summarize_run(runtime, result) if parallel.is_main_process() else None
        return result
    except BaseException as exc:
        if parallel.is_main_process():  # the output directory is this run's: say how it ended
            summarize_run(runtime, None, exc)
        raise
    finally:
        if trainer.parallel is not None:
            trainer.parallel.restore_signals()
        logger.close()


def prepare_output(config: SpeedtronicConfig) -> str | None:
    """Make sure a fresh run does not land on another run's checkpoints (issue 21).

    Resuming uses what is there. A fresh run in a directory holding a run is refused, unless
    ``checkpoint.overwrite`` says to delete that run first: its checkpoints, its summary.json,
    and the text and JSONL logs this config writes in the output directory, which describe it
    (a log file elsewhere may be shared, and a device such as /dev/null is never a run's).
    Returns the notice to log, if any.
    """
    held = held_run(config.checkpoint_dir)
    if config.checkpoint.resume:
        return None
    if held is None:  # a summary here is of a run that saved nothing: not this one's
        _remove_log(config.output_dir / SUMMARY_FILE, "run.output_dir")
        return None
    if not config.checkpoint.overwrite:  # name the key the user set the place with
        if config.checkpoint.directory is not None:
            check_fresh_start(held, "checkpoint.directory", config.checkpoint_dir)
        else:
            check_fresh_start(held, "run.output_dir", config.output_dir)
    notice = clear_checkpoints(held)
    for key, name in (
        ("logging.file", config.logging.file),
        ("logging.json_file", config.logging.json_file),
    ):
        path = _in_output(config, name)
        if path is not None and path.is_file() and _inside(path, config.output_dir):
            _remove_log(path, key)
    _remove_log(config.output_dir / SUMMARY_FILE, "run.output_dir")
    return notice


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def _remove_log(path: Path, key: str) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        raise OutputError(
            f"{key}: --overwrite could not delete {path}: {exc.strerror or exc}"
        ) from exc


def run_logger(config: SpeedtronicConfig, console: bool, hooks: Any) -> MetricLogger:
    """The run's logger: console, text and JSONL files in the output dir, and the hooks.

    In a DDP group only rank 0 reports: the other ranks' loggers print and write nothing.
    """
    if not parallel.is_main_process():
        return MetricLogger(console=False)
    return MetricLogger(
        console=console,
        file=_in_output(config, config.logging.file),
        json_file=_in_output(config, config.logging.json_file),
        hooks=[*load_hooks(config.logging.hooks), *(hooks or [])],
        level=config.logging.level,
    )


def coordinate_only(config: SpeedtronicConfig, hooks: Any, console: bool) -> TrainResult:
    """A DumbDiLoCo master that does not train: it aggregates and publishes until done. It is a
    run like any other (issue 53): it claims its output directory while it lives (refused
    where a live run holds it) and leaves a summary.json however it ends."""
    run_marker.check_free(config.output_dir)
    running = run_marker.claim(config.output_dir)
    try:
        return _coordinate(config, hooks, console)
    finally:
        run_marker.release(running)


def _coordinate(config: SpeedtronicConfig, hooks: Any, console: bool) -> TrainResult:
    from speedtronic.distributed import setup

    logger = run_logger(config, console, hooks)
    done: dict[str, Any] = {"started_at": now_iso(), "params": None}
    try:
        seed_everything(config.run.seed)  # the same initial weights as every worker
        config, model, adapters = coordinator_model(config, logger)  # --init-from, model.lora
        done["params"] = count_parameters(model)
        logger.log("run_start", coordinator_facts(config))  # hooks open their runs on it
        done.update(setup.coordinate_only(config, model, logger, adapters))
        status = "interrupted" if done["signal"] else "completed"
        result = TrainResult(0, None, 0, 0, done["elapsed_s"], status, done["signal"])
        logger.log("run_end", {**result.__dict__, "outer_step": done["outer_step"]})
        summary = partial(coordinator_summary, config, done)
        result.summary = store_summary(config.output_dir, summary, logger)
        return result
    except BaseException as exc:
        store_summary(config.output_dir, partial(coordinator_summary, config, done, exc), logger)
        raise
    finally:
        logger.close()


def coordinator_facts(config: SpeedtronicConfig) -> dict[str, Any]:
    """run_start of a DumbDiLoCo master that only coordinates (it builds no trainer)."""
    dist = config.distributed
    return {
        "name": config.run.name,
        "model": config.model.name,
        "max_steps": config.run.max_steps,
        "output_dir": str(config.output_dir),
        "role": dist.role,
        "node_id": dist.resolved_node_id,
        "repo": dist.repo,
        "train_locally": False,
        "outer_steps": dist.outer_steps,
    }


def check_model(config: SpeedtronicConfig) -> nn.Module:
    """Build the configured model on the meta device: its config errors, without the memory."""
    with torch.device("meta"):
        return build_model(config.model.name, config.model.params, config.model.imports)


def check_seq_len(config: SpeedtronicConfig) -> int:
    """The data block length; a ``model.seq_len`` that sets it must be a positive integer.

    Any model's ``model.seq_len`` doubles as the block length when ``data.seq_len`` is unset,
    so a custom model's value is checked here, before ``int()`` turns 'abc' into a crash
    and 12.5 or true into a silent 12 or 1.
    """
    value = config.model.params.get("seq_len")
    if config.data.seq_len is None and value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"model.seq_len: must be a positive integer, it also sets the data block "
                f"length (got {repr(value)[:60]})"
            )
    return config.seq_len


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights appear once


def flops_per_token(model: nn.Module, seq_len: int) -> float:
    """The model's own estimate when it has one, else the 6N rule."""
    method = getattr(model, "flops_per_token", None)
    if callable(method):
        return float(method(seq_len))
    return 6.0 * count_parameters(model)


def load_hooks(paths: list[str]) -> list[Any]:
    """Hooks named ``tensorboard``, ``wandb`` or by import path; classes are instantiated."""
    builtin = {
        "tensorboard": "speedtronic.observe.integrations:TensorBoardHook",
        "wandb": "speedtronic.observe.integrations:WandbHook",
    }
    hooks = [import_object(builtin.get(path, path), "logging.hooks") for path in paths]
    return [hook() if isinstance(hook, type) else hook for hook in hooks]


def _in_output(config: SpeedtronicConfig, path: str | None) -> Path | None:
    """Relative log paths live in the run's output directory."""
    if path is None:
        return None
    return Path(path) if Path(path).is_absolute() else config.output_dir / path


def _enable_checkpointing(model: nn.Module, logger: MetricLogger) -> None:
    method = getattr(model, "set_gradient_checkpointing", None)
    if callable(method):
        method(True)
    else:
        logger.warn(
            f"gradient_checkpointing: {type(model).__name__} has no "
            "set_gradient_checkpointing(enabled); training without it"
        )

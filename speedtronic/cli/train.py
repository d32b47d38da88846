"""``speedtronic train`` and ``speedtronic validate``: load a config, run it or check it."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import typer

from speedtronic.cli.diloco_facts import Fleet, diloco_facts, fleet_warnings, measured_warnings
from speedtronic.cli.errors import handle_errors
from speedtronic.cli.machine_facts import data_facts, machine_warnings, precision_facts
from speedtronic.cli.options import (
    JSON_SCHEMA_VERSION,
    AllowTokenizerMismatchOpt,
    ConfigOpt,
    DeviceOpt,
    InitFromOpt,
    InitOverrideOpt,
    MaxStepsOpt,
    NodeIdOpt,
    NprocOpt,
    OutputDirOpt,
    OutputFormat,
    OverwriteOpt,
    RepoOpt,
    ResumeOpt,
    RewarmOpt,
    RoleOpt,
    SeedOpt,
    SetOpt,
    ThreadsOpt,
    TimeBudgetOpt,
    budget_flags,
    format_option,
    load_run_config,
    log_format_option,
    run_sets,
)
from speedtronic.cli.run_summary import show_summary
from speedtronic.errors import ConfigError, TransportError

if TYPE_CHECKING:  # the config package loads with the command, not with --help
    from speedtronic.config import SpeedtronicConfig


def train(
    config: Path | None = ConfigOpt,
    max_steps: int | None = MaxStepsOpt,
    time_budget: str | None = TimeBudgetOpt,
    output_dir: Path | None = OutputDirOpt,
    device: str | None = DeviceOpt,
    seed: int | None = SeedOpt,
    threads: int | None = ThreadsOpt,
    resume: bool = ResumeOpt,
    rewarm: int | None = RewarmOpt,
    overwrite: bool = OverwriteOpt,
    init_from: str | None = InitFromOpt,
    init_overrides: list[str] | None = InitOverrideOpt,
    allow_tokenizer_mismatch: bool = AllowTokenizerMismatchOpt,
    role: str | None = RoleOpt,
    node_id: str | None = NodeIdOpt,
    repo: str | None = RepoOpt,
    nproc_per_node: int | None = NprocOpt,
    overrides: list[str] | None = SetOpt,
    log_format: OutputFormat = log_format_option(),
    output_format: OutputFormat = format_option(
        "the run summary as 'summary: KEY VALUE' lines at the end; also in summary.json"
    ),
) -> None:
    """Train a model. With no arguments, runs the embedded smoke config (CPU-safe, 15-30 s on 2
    quiet cores)."""
    flags = {"max_steps": max_steps, "output_dir": output_dir, "device": device, "seed": seed}
    flags["run.threads"] = threads
    flags |= budget_flags(time_budget, max_steps)
    summary_json = output_format is OutputFormat.json
    if summary_json and log_format is OutputFormat.json:
        raise ConfigError(
            "--format json: stdout already carries --log-format json's events; choose one "
            "(the summary is the same in summary.json)"
        )
    nodes = {"role": role, "node_id": node_id, "repo_id": repo}
    sets = run_sets(flags, nodes, resume, rewarm, overwrite, init_from, init_overrides,
                    allow_tokenizer_mismatch, overrides)  # fmt: skip
    cfg = load_run_config(config, sets + list(overrides or []), init_from is not None)
    if nproc_per_node is not None:
        # checked here, once: N children refusing the same config print N errors + torchrun's report
        cfg.accumulation_for(nproc_per_node)
        exec_torchrun(nproc_per_node)

    from speedtronic.cli.display import make_display
    from speedtronic.runtime import train_from_config

    as_json = log_format is OutputFormat.json
    # JSON mode: stdout carries only event lines (or the summary); other output goes to stderr.
    json_out = as_json or summary_json
    with events_stdout() if json_out else contextlib.nullcontext(sys.stdout) as out:
        # In a DDP group only rank 0 shows progress.
        level = cfg.logging.level
        display = make_display(log_format.value, out, level) if _main_rank() else _Silent()
        try:
            result = train_from_config(cfg, hooks=[display], console=False)
        finally:
            display.close()
    show_summary(result.summary, summary_json, as_json)
    # the same command continues the run: --overwrite would now delete what it saved
    kept = [a for a in sys.argv[1:] if a not in ("--resume", "--overwrite")]
    again = shlex.join(["speedtronic", *kept])
    if result.status != "interrupted" and getattr(result, "unsent", False):
        line = f"deltas not sent yet wait in the checkpoint; send them with: {again} --resume"
        print(line, file=sys.stderr)
    if result.status != "interrupted" and getattr(result, "failure", None):
        raise TransportError(result.failure)  # saved and said, but not exit 0
    if result.status == "interrupted":
        saved = f"; checkpoint saved to {result.checkpoint}" if result.checkpoint else ""
        print(
            f"interrupted at step {result.steps}{saved}\nresume with: {again} --resume",
            file=sys.stderr,
        )
        raise typer.Exit(128 + (result.signal or signal.SIGINT))


def exec_torchrun(nproc: int) -> None:
    """Replace this process with torchrun running the same command on ``nproc`` ranks."""
    import os

    if os.environ.get("WORLD_SIZE"):
        raise ConfigError("--nproc-per-node: already running under torchrun; drop the option")
    args, skip = [], False
    for arg in sys.argv[1:]:
        if skip or arg == "--nproc-per-node" or arg.startswith("--nproc-per-node="):
            skip = arg == "--nproc-per-node" and not skip
            continue
        args.append(arg)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={nproc}", "-m", "speedtronic", *args]
    sys.stdout.flush()
    os.execv(sys.executable, command)


def _main_rank() -> bool:
    import os

    return os.environ.get("RANK", "0") in ("", "0")


class _Silent:
    """The display of ranks other than 0: they show nothing."""

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


@contextlib.contextmanager
def events_stdout() -> Iterator[IO[str]]:
    """The event stream: the real stdout, while everything else written there goes to stderr.

    Python's prints are redirected; when stdout is a real file descriptor, descriptor 1 itself
    points at stderr for the run too, so C extensions and child processes cannot slip a line
    into the stream, and the events go to a duplicate of the original.
    """
    try:
        real = sys.stdout.fileno() == 1
    except (AttributeError, OSError, ValueError):  # a test runner's in-memory stdout
        real = False
    if not real:
        out = sys.stdout
        with contextlib.redirect_stdout(sys.stderr):
            yield out
        return
    sys.stdout.flush()
    saved = os.dup(1)
    events = os.fdopen(os.dup(saved), "w", buffering=1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield events
    finally:
        events.close()
        os.dup2(saved, 1)
        os.close(saved)


def validate(
    config: Path | None = ConfigOpt,
    overrides: list[str] | None = SetOpt,
    output_format: OutputFormat = format_option("the YAML and derived facts"),
    world_size: int | None = typer.Option(
        None,
        "--world-size",
        min=1,
        help="Ranks (processes, e.g. GPUs) sharing each step, for the batch arithmetic; "
        "default: WORLD_SIZE from the environment, else 1.",
    ),
    build: bool = typer.Option(
        False,
        "--build",
        help="Also import model.imports and build an import-path model to count its "
        "parameters. This runs code the config names: use it only on configs you trust.",
    ),
    nodes: int = typer.Option(
        4,
        "--nodes",
        min=1,
        max=100_000,
        help="Workers in the DumbDiLoCo fleet, for what it costs per hour (requests and bytes "
        "for a bucket, commits for a Hub repo).",
    ),
    step_time: float = typer.Option(
        1.0,
        "--step-time",
        min=0.001,
        max=86400,
        help="Seconds per optimizer step on a worker (measure it with speedtronic bench), for "
        "the same estimate and the latency fraction f.",
    ),
    uplink: float | None = typer.Option(
        None,
        "--uplink",
        min=0.01,
        max=1e6,
        help="A worker's upload bandwidth in Mbit/s, for the time a delta takes to reach the "
        "repo (the latency fraction f); default 50.",
    ),
    max_steps: int | None = MaxStepsOpt,
    time_budget: str | None = TimeBudgetOpt,
    output_dir: Path | None = OutputDirOpt,
    device: str | None = DeviceOpt,
    seed: int | None = SeedOpt,
    threads: int | None = ThreadsOpt,
    resume: bool = ResumeOpt,
    rewarm: int | None = RewarmOpt,
    overwrite: bool = OverwriteOpt,
    init_from: str | None = InitFromOpt,
    init_overrides: list[str] | None = InitOverrideOpt,
    allow_tokenizer_mismatch: bool = AllowTokenizerMismatchOpt,
    role: str | None = RoleOpt,
    node_id: str | None = NodeIdOpt,
    repo: str | None = RepoOpt,
    nproc_per_node: int | None = NprocOpt,
) -> None:
    """Check a config: print the resolved (redacted) config and derived facts, or every problem.

    Takes train's options, so it checks the run that train with them starts: with --init-from,
    the model and tokenizer taken from the source. Runs no code the config names unless --build
    is given: only registered models are built.
    """
    flags = {"max_steps": max_steps, "output_dir": output_dir, "device": device, "seed": seed}
    flags["run.threads"] = threads
    flags |= budget_flags(time_budget, max_steps)
    node = {"role": role, "node_id": node_id, "repo_id": repo}
    sets = run_sets(flags, node, resume, rewarm, overwrite, init_from, init_overrides,
                    allow_tokenizer_mismatch, overrides)  # fmt: skip
    cfg = load_run_config(config, sets + list(overrides or []), init_from is not None)
    fleet = Fleet(nodes, step_time, uplink or Fleet.uplink_mbps)
    warnings: list[str] = []
    cfg, facts = init_facts(cfg, warnings)
    world_size = world_size or nproc_per_node
    facts |= derived_facts(cfg, build=build, world_size=world_size, fleet=fleet, warnings=warnings)
    if cfg.distributed.enabled:
        warnings += measured_warnings(cfg) + fleet_warnings(cfg, fleet)
    for message in warnings:
        print(f"speedtronic: warning: {message}", file=sys.stderr)
    if output_format is OutputFormat.json:
        doc = {"schema_version": JSON_SCHEMA_VERSION, "config": cfg.to_dict(), "facts": facts}
        doc["warnings"] = warnings
        print(json.dumps(doc, indent=2))
        return
    print(cfg.to_yaml().rstrip())
    print("---")
    for key, value in facts.items():
        print(f"# {key}: {json.dumps(value) if isinstance(value, dict) else value}")


def init_facts(cfg: SpeedtronicConfig, warnings: list[str]) -> tuple[SpeedtronicConfig, dict]:
    """With --init-from, the config train would run (the source's model and tokenizer where
    it names none) and what it starts from; ``cfg`` and nothing without."""
    from speedtronic.checkpoint.tokenizer import describe
    from speedtronic.train.init_source import init_config, names_no_model

    adopted, source = init_config(cfg, warnings.append)
    if source is None:
        return cfg, {}
    model = "the source's" if names_no_model(cfg) else "the config's, checked against the source's"
    text = adopted.data.resolved_source == "text"
    tokenizer = adopted.data.tokenizer if text else describe(source.record)
    return adopted, {"init_from": {"source": source.where, "model": model, "tokenizer": tokenizer}}


def derived_facts(
    cfg: SpeedtronicConfig,
    build: bool = False,
    world_size: int | None = None,
    fleet: Fleet | None = None,
    warnings: list[str] | None = None,
) -> dict[str, Any]:
    """Facts that need torch: device and model problems are collected, not raised one by one.

    ``warnings`` receives what this machine would make of the config (machine_facts).
    """
    from speedtronic.runtime import check_seq_len, load_hooks
    from speedtronic.train.precision import resolve_device

    problems: list[str] = []
    warnings = [] if warnings is None else warnings
    facts: dict[str, Any] = {}
    try:
        facts.update(batch_facts(cfg, world_size or cfg.world_size))
        facts["tokens_per_optimizer_step"] = facts["batch_size"] * check_seq_len(cfg)
    except ConfigError as exc:
        problems.extend(exc.problems)
    facts["output_dir"] = str(cfg.output_dir)
    data, missing = data_facts(cfg)
    facts.update(data)
    problems += missing
    try:
        device = resolve_device(cfg.run.device)
        facts["device"] = str(device)
        precision, slow = precision_facts(cfg, device)
        facts.update(precision)
        warnings += slow
    except ConfigError as exc:
        problems.append(str(exc))
    warnings += machine_warnings(cfg)
    try:  # the built-in hooks only: they check their optional package (import paths run code)
        load_hooks([h for h in cfg.logging.hooks if h in ("tensorboard", "wandb")])
    except ConfigError as exc:
        problems.extend(exc.problems)
    try:
        facts["parameters"], model = _parameter_fact(cfg, build)
        if cfg.optimizer.name == "muon" and model is not None:  # issue 30: which go to Muon
            from speedtronic.optim.param_split import split_parameters

            facts["optimizer"] = split_parameters(model, cfg.optimizer.muon_exclude).summary()
        if cfg.model.lora is not None and model is not None:  # its targets, checked
            from speedtronic.train.lora import describe

            facts["lora"] = describe(model, cfg.model.lora)
        if cfg.distributed.enabled:
            facts.update(diloco_facts(cfg, model, fleet or Fleet()))
    except ConfigError as exc:
        problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems[0], problems=problems)
    return facts


def batch_facts(cfg: SpeedtronicConfig, world: int) -> dict[str, Any]:
    """Accumulation and the global batch; with several ranks, the arithmetic behind them."""
    accumulation = cfg.accumulation_for(world)
    micro = cfg.data.micro_batch_size
    facts: dict[str, Any] = {
        "accumulation_steps": accumulation,
        "batch_size": micro * accumulation * world,
    }
    if world > 1:
        facts["world_size"] = world
        facts["batch_arithmetic"] = (
            f"target_batch_size {micro * accumulation * world} = micro_batch_size {micro} x "
            f"world size {world} x accumulation {accumulation}"
        )
    return facts


def _parameter_fact(cfg: SpeedtronicConfig, build: bool) -> tuple[int | str, Any]:
    """The model's parameter count (or why it was not counted), and the meta-device model.

    Building runs the config's code (model.imports, an import-path factory), so without
    ``--build`` only models registered by Speedtronic itself are built. The reference model is
    counted from its sizes (issue 31: building a GPT-2 even on the meta device took ~1.3 s,
    most of validate's time); a DumbDiLoCo config builds it for the delta sizes, and Muon for
    its split of the parameters.
    """
    from speedtronic.registry import is_import_path, reference_config
    from speedtronic.runtime import check_model, count_parameters

    model = cfg.model
    if not build and is_import_path(model.name):
        return "not counted (import-path model; pass --build to build it)", None
    if not build and model.imports:
        return "not counted (model.imports not imported; pass --build to import them)", None
    counted = not cfg.distributed.enabled and cfg.optimizer.name != "muon"  # these need it built
    counted &= cfg.model.lora is None  # and LoRA, for its targets
    if model.name == "reference_transformer" and not model.imports and counted:
        return reference_config(model.params).parameter_count(), None
    built = check_model(cfg)  # on the meta device: counted without allocating
    return count_parameters(built), built


def register(app: typer.Typer) -> None:
    # short_help: the line in `speedtronic --help`, where the first sentence would be cut short
    app.command(short_help="Train a model; no arguments: the embedded smoke run.")(
        handle_errors(train)
    )
    app.command(short_help="Check a config: the resolved config and derived facts.")(
        handle_errors(validate)
    )

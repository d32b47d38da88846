"""Options and arguments shared by several commands, and loading the config they name.

One definition each, so every command spells, documents and validates them the same way.
Nothing here imports the config package (YAML, the section dataclasses) at module level:
every command module imports this one, and ``--help`` and shell completion load them all.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from speedtronic.data.describe import size_text  # noqa: F401  (the commands' size column)
from speedtronic.errors import ConfigError
from speedtronic.observe.metrics import UNCAPPED_STEPS

if TYPE_CHECKING:
    from speedtronic.config import SpeedtronicConfig


class OutputFormat(str, Enum):
    """``--format``: human-readable text or one JSON document on stdout."""

    text = "text"
    json = "json"


def format_option(text_help: str) -> Any:
    """``--format text|json``; ``text_help`` says what the text form looks like."""
    return typer.Option(
        OutputFormat.text,
        "--format",
        help=f"Output format: text ({text_help}) or json (one document on stdout).",
    )


def log_format_option() -> Any:
    """``--log-format text|json`` of ``train``: how a run reports while it runs."""
    return typer.Option(
        OutputFormat.text,
        "--log-format",
        help="Progress format: text (a live table or plain lines on stderr, the summary on "
        "stdout) or json (stdout carries only JSON events, one per line, schema in "
        "docs/events.md; people's text goes to stderr).",
    )


def text_suffix_option() -> Any:
    """``--text-suffix`` of ``data tokenize`` and ``data tokenizer train``: a directory SOURCE's
    files of another kind (source code, Markdown) read as text."""
    return typer.Option(
        [],
        "--text-suffix",
        metavar="SUFFIX",
        help="Also read a directory SOURCE's files ending in SUFFIX (e.g. .py) as UTF-8 text, "
        "one document each, as the glob 'DIR/**/*SUFFIX' would; repeatable.",
    )


# Every --format json document carries this (and bumps it on a rename or removal).
JSON_SCHEMA_VERSION = 1


ConfigOpt = typer.Option(
    None,
    "--config",
    "-c",
    help="Path to a YAML or JSON config file. Default: the embedded smoke run.",
)
SetOpt = typer.Option(
    None,
    "--set",
    metavar="KEY=VALUE",
    help="Override one key without editing the file, e.g. --set optimizer.lr=1e-3. "
    "Repeatable; values are parsed as YAML.",
)


# What ``train`` takes that changes the run; ``validate`` takes them too, to check that run.
MaxStepsOpt = typer.Option(
    None, "--max-steps", help="Train until this many optimizer steps in total (run.max_steps)."
)
TimeBudgetOpt = typer.Option(
    None,
    "--time-budget",
    metavar="DURATION",
    help="Train for this much training time: 300, 300s, 5m or 1h, counted from the end of the "
    "first optimizer step (start-up apart), then end as a completed run: checkpoint, final "
    "evaluation, summary (run.time_budget_s). The LR schedule decays over it. Without "
    "--max-steps only the clock ends the run; with it, whichever comes first.",
)
OutputDirOpt = typer.Option(
    None, "--output-dir", help="Directory for logs and checkpoints (run.output_dir)."
)
DeviceOpt = typer.Option(
    None, "--device", help="Device to train on: auto, cpu, cuda, cuda:N or mps (run.device)."
)
SeedOpt = typer.Option(None, "--seed", help="Random seed of the run (run.seed).")
ThreadsOpt = typer.Option(
    None,
    "--threads",
    min=0,
    help="CPU threads torch computes with (run.threads). Default: torch's (one per core); 0 "
    "too. On cores other processes keep busy, 1 is often several times faster "
    "(docs/troubleshooting.md).",
)
ResumeOpt = typer.Option(
    False, "--resume", help="Continue from the newest checkpoint in the checkpoint directory."
)
RewarmOpt = typer.Option(
    None,
    "--rewarm",
    metavar="STEPS",
    help="With --resume: start a new LR schedule from the saved optimizer state: warm up "
    "linearly over STEPS to optimizer.lr, then decay per scheduler.name to run.max_steps "
    "(scheduler.rewarm_steps). Extends a finished run.",
)
OverwriteOpt = typer.Option(
    False,
    "--overwrite",
    help="Start fresh where another run is: delete its checkpoints and logs first "
    "(checkpoint.overwrite). Without it, a directory holding a run is refused.",
)
InitFromOpt = typer.Option(
    None,
    "--init-from",
    help="Start a new run from the weights of another: its output directory, its "
    "checkpoints/ directory or one step_* directory, or a transformers model (a directory "
    "such as speedtronic export's, or hf://OWNER/NAME[@REV]) (checkpoint.init_from). The "
    "optimizer, LR schedule, step count and random streams start fresh; a config naming no "
    "model (or no config) takes the source's model and tokenizer.",
)
InitOverrideOpt = typer.Option(
    None,
    "--init-override",
    metavar="KEY",
    help="Let this model key (e.g. rope_theta) differ from the --init-from source's, which "
    "is otherwise refused (checkpoint.init_overrides); repeatable.",
)
AllowTokenizerMismatchOpt = typer.Option(
    False,
    "--allow-tokenizer-mismatch",
    help="Train on data tokenized with another tokenizer than the --init-from source's (bytes, "
    "or another tokenizer.json), which is otherwise refused; the checkpoints then record the "
    "data's tokenizer (checkpoint.allow_tokenizer_mismatch).",
)
RoleOpt = typer.Option(
    None,
    "--role",
    help="DumbDiLoCo role of this node: master or worker (distributed.role). "
    "Any of --role, --node-id and --repo turns distributed training on.",
)
NodeIdOpt = typer.Option(
    None, "--node-id", help="This node's name in the shared repo (distributed.node_id)."
)
RepoOpt = typer.Option(
    None,
    "--repo",
    help="The run's shared repo: a Hub repo id, a bucket s3://bucket/prefix, or a directory "
    "path or file:// URL (distributed.repo_id).",
)
NprocOpt = typer.Option(
    None,
    "--nproc-per-node",
    min=1,
    help="Train with this many processes on this machine (DDP, one per GPU): runs "
    "torchrun --nproc-per-node N -m speedtronic train with the other options unchanged.",
)


def budget_flags(duration: str | None, max_steps: int | None) -> dict[str, Any]:
    """``--time-budget``'s ``run.*`` keys: the seconds, and no step cap unless --max-steps
    sets one (the config's max_steps would otherwise end a budgeted run early)."""
    if duration is None:
        return {}
    flags: dict[str, Any] = {"run.time_budget_s": duration_seconds(duration)}
    if max_steps is None:
        flags["max_steps"] = UNCAPPED_STEPS
    return flags


def duration_seconds(text: str) -> float:
    """``300``, ``300s``, ``5m``, ``1.5h``: seconds; a ConfigError naming --time-budget else."""
    units = {"s": 1, "m": 60, "h": 3600}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        seconds = float(number) * units[unit]
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):  # also NaN
        raise ConfigError(
            f"--time-budget: must be a positive duration such as 300, 300s, 5m or 1h "
            f"(got {text[:40]!r})"
        )
    return seconds


def run_sets(
    flags: dict[str, Any],
    nodes: dict[str, Any],
    resume: bool,
    rewarm: int | None,
    overwrite: bool,
    init_from: str | None,
    init_overrides: list[str] | None,
    allow_tokenizer_mismatch: bool = False,
    overrides: list[str] | None = None,
) -> list[str]:
    """The ``--set`` overrides train's run options make: ``flags`` are ``run.*`` keys and
    ``nodes`` ``distributed.*`` ones (any of which turns distributed training on); the user's
    own ``overrides`` are read for a max_steps (on a resume: steps instead of a budget)."""
    sets = [f"{k}={v}" for k, v in flags.items() if v is not None]
    sets += [f"distributed.{k}={json.dumps(v)}" for k, v in nodes.items() if v is not None]
    if any(v is not None for v in nodes.values()):
        sets.append("distributed.enabled=true")
    if resume:
        sets.append("checkpoint.resume=true")
    if resume and "run.time_budget_s" not in flags and _sets_max_steps(flags, overrides):
        sets.append("checkpoint.keep_budget=false")  # steps end a budgeted run instead
    if rewarm is not None:
        sets.append(f"scheduler.rewarm_steps={rewarm}")
    if overwrite:
        sets.append("checkpoint.overwrite=true")
    if init_from is not None:
        sets.append(f"checkpoint.init_from={json.dumps(str(init_from))}")
    if init_overrides:
        sets.append(f"checkpoint.init_overrides={json.dumps(list(init_overrides))}")
    if allow_tokenizer_mismatch:
        sets.append("checkpoint.allow_tokenizer_mismatch=true")
    return sets


def _sets_max_steps(flags: dict[str, Any], overrides: list[str] | None) -> bool:
    """--max-steps, or ``--set max_steps=N`` / ``run.max_steps=N``, is on the command line."""
    keys = {o.partition("=")[0].strip() for o in overrides or []}
    return flags.get("max_steps") is not None or bool(keys & {"max_steps", "run.max_steps"})


def load_run_config(path: Path | None, sets: list[str], init: bool) -> SpeedtronicConfig:
    """The run's config; with --init-from and no --config, the smoke run without its model, so
    that the source's model and tokenizer are taken."""
    if path is not None or not init:
        return load_config(path, sets)
    import yaml

    from speedtronic.config import SpeedtronicConfig, default_config_text

    raw = yaml.safe_load(default_config_text())
    raw.pop("model", None)
    return SpeedtronicConfig.from_yaml(yaml.safe_dump(raw), sets)


def load_config(path: Path | None, overrides: list[str]) -> SpeedtronicConfig:
    """The config at ``path`` (the embedded smoke run if None) with ``--set`` overrides."""
    from speedtronic.config import SpeedtronicConfig, default_config_text

    if path is None:
        return SpeedtronicConfig.from_yaml(default_config_text(), overrides)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory; pass a .yaml or .json file")
    return SpeedtronicConfig.from_file(path, overrides)


def count_text(value: int | None) -> str:
    """A count for a table: thousands separated, ``-`` when unknown."""
    return "-" if value is None else f"{value:,}"

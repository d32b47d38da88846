"""``speedtronic train`` and ``speedtronic validate``: load a config, run it or check it."""

from __future__ import annotations

import json
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

import typer

from speedtronic.cli.errors import handle_errors
from speedtronic.cli.options import ConfigOpt, OutputFormat, SetOpt, format_option, load_config
from speedtronic.config import SpeedtronicConfig
from speedtronic.errors import ConfigError


def train(
    config: Path | None = ConfigOpt,
    max_steps: int | None = typer.Option(
        None, "--max-steps", help="Train until this many optimizer steps in total (run.max_steps)."
    ),
    output_dir: Path | None = typer.Option(
        None, "--output-dir", help="Directory for logs and checkpoints (run.output_dir)."
    ),
    device: str | None = typer.Option(
        None, "--device", help="Device to train on: auto, cpu, cuda, cuda:N or mps (run.device)."
    ),
    seed: int | None = typer.Option(None, "--seed", help="Random seed of the run (run.seed)."),
    resume: bool = typer.Option(
        False, "--resume", help="Continue from the newest checkpoint in the checkpoint directory."
    ),
    overrides: list[str] | None = SetOpt,
) -> None:
    """Train a model. With no arguments, runs the embedded smoke config (CPU-safe, < 1 min)."""
    flags = {"max_steps": max_steps, "output_dir": output_dir, "device": device, "seed": seed}
    sets = [f"{k}={v}" for k, v in flags.items() if v is not None]
    if resume:
        sets.append("checkpoint.resume=true")
    cfg = load_config(config, sets + list(overrides or []))

    from speedtronic.cli.display import make_display
    from speedtronic.runtime import train_from_config

    display = make_display()
    try:
        result = train_from_config(cfg, hooks=[display], console=False)
    finally:
        display.close()
    if result.status == "interrupted":
        saved = f"; checkpoint saved to {result.checkpoint}" if result.checkpoint else ""
        again = shlex.join(["speedtronic", *[a for a in sys.argv[1:] if a != "--resume"]])
        print(
            f"interrupted at step {result.steps}{saved}\nresume with: {again} --resume",
            file=sys.stderr,
        )
        raise typer.Exit(128 + (result.signal or signal.SIGINT))


def validate(
    config: Path | None = ConfigOpt,
    overrides: list[str] | None = SetOpt,
    output_format: OutputFormat = format_option("the YAML and derived facts"),
) -> None:
    """Check a config: print the resolved (redacted) config and derived facts, or every problem."""
    cfg = load_config(config, list(overrides or []))
    facts = derived_facts(cfg)
    if output_format is OutputFormat.json:
        print(json.dumps({"config": cfg.to_dict(), "facts": facts}, indent=2))
        return
    print(cfg.to_yaml().rstrip())
    print("---")
    for key, value in facts.items():
        print(f"# {key}: {value}")


def derived_facts(cfg: SpeedtronicConfig) -> dict[str, Any]:
    """Facts that need torch: device and model problems are collected, not raised one by one."""
    import torch

    from speedtronic.precision import resolve_device
    from speedtronic.registry import build_model
    from speedtronic.runtime import count_parameters

    problems: list[str] = []
    facts: dict[str, Any] = {
        "accumulation_steps": cfg.accumulation_steps,
        "batch_size": cfg.batch_size,
        "tokens_per_optimizer_step": cfg.tokens_per_step,
        "output_dir": str(cfg.output_dir),
    }
    try:
        facts["device"] = str(resolve_device(cfg.run.device))
    except ConfigError as exc:
        problems.append(str(exc))
    try:
        with torch.device("meta"):  # count parameters without allocating them
            model = build_model(cfg.model.name, cfg.model.params, cfg.model.imports)
        facts["parameters"] = count_parameters(model)
    except ConfigError as exc:
        problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems[0], problems=problems)
    return facts


def register(app: typer.Typer) -> None:
    app.command()(handle_errors(train))
    app.command()(handle_errors(validate))

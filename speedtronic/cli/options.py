"""Options and arguments shared by several commands, and loading the config they name.

One definition each, so every command spells, documents and validates them the same way.
Nothing here imports the config package (YAML, the section dataclasses) at module level:
every command module imports this one, and ``--help`` and shell completion load them all.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from speedtronic.data.describe import size_text  # noqa: F401  (the commands' size column)
from speedtronic.errors import ConfigError

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

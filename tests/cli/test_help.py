"""``--help`` as people read it: flags without a value placeholder, values named by what they hold.

Issue 21: Typer's Rich help printed every flag as if it took a value (``--resume <bool>``,
``--help <bool>``, ``--version <bool>``) and ``--set`` as ``<list[str]>``. These tests render
the help of every command and pin what each kind of option shows.
"""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from speedtronic.cli.app import app

runner = CliRunner()


def command_paths() -> list[list[str]]:
    """Every visible command path: [], ["train"], ["ckpt"], ["ckpt", "inspect"], ..."""
    root = typer.main.get_command(app)
    found: list[list[str]] = []

    def visit(command, path: list[str]) -> None:
        found.append(path)
        for name, sub in getattr(command, "commands", {}).items():
            if not sub.hidden:
                visit(sub, [*path, name])

    visit(root, [])
    return found


def flags_of(path: list[str]) -> list[str]:
    """The long names of the boolean flags of the command at ``path`` (``--help`` included)."""
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    flags = [o for p in command.params if getattr(p, "is_flag", False) for o in p.opts]
    return [f for f in flags if f.startswith("--")] + ["--help"]


def help_text(path: list[str]) -> str:
    result = runner.invoke(app, [*path, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p) or "speedtronic")
def test_flags_show_no_value_placeholder(path):
    text = help_text(path)
    options = [line for line in text.splitlines() if line.lstrip().startswith("-")]
    assert not [line for line in options if "<bool>" in line or "<list[" in line], text
    for flag in flags_of(path):
        line = next((ln for ln in text.splitlines() if re.match(rf"\s*(-\w, )?{flag}\b", ln)), None)
        assert line is not None, f"{flag} missing from the help of {path}:\n{text}"
        after = line.split(flag, 1)[1]
        # the flag is followed by its help text (or nothing, when the help wraps), no value
        assert not after.strip().startswith(("<", "[", "BOOL", "TEXT")), line


def test_the_help_of_train_pins_the_rendering():
    text = help_text(["train"])
    assert re.search(r"^  --resume +Continue from the newest checkpoint", text, re.M), text
    assert re.search(r"^  --set KEY=VALUE +Override one key", text, re.M), text
    assert re.search(r"^  --help +Show this message and exit\.", text, re.M), text
    assert re.search(r"^  --max-steps <int> +Train until", text, re.M), text


def test_the_root_help_lists_every_command_and_its_flags():
    text = help_text([])
    assert re.search(r"^  --version +Print the version and exit\.", text, re.M), text
    commands = text.split("Commands:")[1]
    for name in ("train", "validate", "bench", "ckpt", "data", "hub", "storage"):
        assert re.search(rf"^  {name} +\S", commands, re.M), commands
    assert "..." not in commands  # every line says what its command does, uncut

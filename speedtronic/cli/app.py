"""Root Typer app: global options, the command groups, and ``main()``.

Imports point one way: this module imports each command module's ``register``; command
modules import only ``errors`` and ``options`` beside them, never this one.

Start-up is part of the interface: shell completion runs this app at every TAB and people run
``--help`` to look at a command, so building it imports Typer and the command modules' option
declarations only (``benchmarks/engine/cli_startup.py``: at most 0.10 of ``import torch``). Help is
Click's plain text (``rich_markup_mode=None``): Typer's Rich help formatter alone imports
Markdown and syntax highlighting, about as long as all the rest, and it renders every flag
as if it took a value (``--resume <bool>``). Rich stays for what commands draw while they run.
"""

from __future__ import annotations

import sys

import typer

from speedtronic.cli import bench, ckpt, data, evaluate, hub, importing, model, runs, storage, train
from speedtronic.cli.errors import CliUsageError, report_usage_error

app = typer.Typer(
    name="speedtronic",
    help="Fast, reliable PyTorch training: one YAML config, one command.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
    rich_markup_mode=None,  # plain help, for every group below too (see the docstring)
)


def _version(value: bool) -> None:
    if value:
        from speedtronic import __version__

        print(f"speedtronic {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Fast, reliable PyTorch training: one YAML config, one command."""


for _group in (train, model, importing, evaluate, ckpt, data, bench, hub, storage, runs):
    _group.register(app)


def main() -> None:
    """Run the CLI; usage errors become one line and exit 2 like every other bad input."""
    try:
        code = app(prog_name="speedtronic", standalone_mode=False)
    except CliUsageError as exc:
        code = report_usage_error(exc)
    except typer.Abort:  # Ctrl-C or end of input at a prompt
        print("speedtronic: aborted", file=sys.stderr)
        code = 1
    sys.exit(code if isinstance(code, int) else 0)

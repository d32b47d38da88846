"""Root Typer app, the error -> exit code mapping, and ``main()``.

Exit codes: 0 ok, 1 runtime failure, 2 bad usage or bad config, 130/143 interrupted.
Errors are one line on stderr (``speedtronic: error: ...``); tracebacks only with
``SPEEDTRONIC_DEBUG=1``.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import typer

from speedtronic.errors import SpeedtronicError

app = typer.Typer(
    name="speedtronic",
    help="Fast, reliable PyTorch training: one YAML config, one command.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)


def debug_enabled() -> bool:
    return os.environ.get("SPEEDTRONIC_DEBUG", "") not in ("", "0")


def error_line(message: str) -> None:
    print(f"speedtronic: error: {message}", file=sys.stderr, flush=True)


def handle_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Map typed errors to one stderr line and an exit code (tracebacks only in debug)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except SpeedtronicError as exc:
            if debug_enabled():
                raise
            for problem in getattr(exc, "problems", None) or [str(exc)]:
                error_line(problem)
            if exc.hint:
                print(f"hint: {exc.hint}", file=sys.stderr)
            raise typer.Exit(exc.exit_code) from None
        except BrokenPipeError:  # `speedtronic ... | head`: the reader left, nothing to report
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(0) from None
        except KeyboardInterrupt:
            print("speedtronic: aborted", file=sys.stderr)
            raise typer.Exit(130) from None
        except Exception as exc:
            if debug_enabled():
                raise
            first = str(exc).splitlines()[0] if str(exc) else ""
            error_line(f"{type(exc).__name__}: {first} (set SPEEDTRONIC_DEBUG=1 for the traceback)")
            raise typer.Exit(1) from None

    return wrapper


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


def _register_commands() -> None:
    from speedtronic.cli import bench, ckpt, data, train

    train.register(app)
    ckpt.register(app)
    data.register(app)
    bench.register(app)


_register_commands()


def main() -> None:
    app()

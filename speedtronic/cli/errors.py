"""The CLI's error contract: typed errors and usage errors -> one stderr line and an exit code.

Exit codes: 0 ok, 1 runtime failure, 2 bad usage or bad config, 130/143 interrupted.
Errors are one line on stderr (``speedtronic: error: ...``, plus a ``hint:`` line where the
error carries one); tracebacks only with ``SPEEDTRONIC_DEBUG=1``. Command modules wrap their
commands with ``handle_errors``; ``app.main`` maps Typer's own usage errors with
``report_usage_error``.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import typer

from speedtronic.errors import ConfigError, SpeedtronicError


def _base_class(name: str) -> type[Exception]:
    """Typer's usage-error classes, found through its public ``BadParameter``.

    Typer >= 0.22 vendors its own Click and older ones use Click itself; both keep the
    ``BadParameter -> UsageError -> ClickException`` hierarchy, so this works with either.
    """
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)


CliUsageError = _base_class("ClickException")


def debug_enabled() -> bool:
    return os.environ.get("SPEEDTRONIC_DEBUG", "") not in ("", "0")


def error_line(message: str) -> None:
    print(f"speedtronic: error: {rank_prefix()}{message}", file=sys.stderr, flush=True)


def rank_prefix() -> str:
    """``rank R of N: `` under torchrun (which rank failed is the first thing to know)."""
    world, rank = os.environ.get("WORLD_SIZE", "1"), os.environ.get("RANK")
    return "" if world in ("", "1") or rank is None else f"rank {rank} of {world}: "


def _first_rank() -> bool:
    return os.environ.get("RANK", "0") in ("", "0")


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
            if isinstance(exc, ConfigError) and not _first_rank():
                raise typer.Exit(exc.exit_code) from None  # every rank has it: rank 0 says it
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
            peer = ("Dist", "gloo", "NCCL", "Connection closed by peer", "Timed out waiting")
            if any(m in f"{type(exc).__name__} {first}" for m in peer):  # a peer went away
                print(
                    "hint: another rank failed or stopped answering (run.group_timeout_s); the "
                    "first error above names it; restart the group with --resume",
                    file=sys.stderr,
                )
            raise typer.Exit(1) from None

    return wrapper


def report_usage_error(exc: Exception) -> int:
    """One line for a usage error Typer raised (bad option, missing argument); its exit code."""
    if type(exc).__name__ == "NoArgsIsHelpError":  # `speedtronic ckpt` alone: show the help
        exc.show()
        return 0
    ctx = getattr(exc, "ctx", None)
    path = ctx.command_path if ctx is not None else "speedtronic"
    command = path.partition(" ")[2]  # "speedtronic ckpt inspect" -> "ckpt inspect"
    message = " ".join(exc.format_message().split())  # Click may wrap long messages
    error_line(f"{command + ': ' if command else ''}{message} (see '{path} --help')")
    return getattr(exc, "exit_code", 2)

"""``speedtronic ckpt inspect`` and ``speedtronic ckpt prune``: see and tidy checkpoints.

Both read only JSON and safetensors headers (``speedtronic.checkpoint.inspection``), never
torch, so they answer instantly even for large checkpoints; ``inspect --verify`` adds the
sha256 of every file (stdlib hashing, still no torch). ``inspect`` also shows the run's loss
history (a sparkline, first / last / min, eval losses) when its metrics JSONL is there.
Rich is imported by the code that draws: ``--help`` and completion load this module.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from speedtronic.cli.errors import handle_errors
from speedtronic.cli.jsonout import json_text
from speedtronic.cli.options import OutputFormat, count_text, format_option, size_text
from speedtronic.errors import ConfigError

if TYPE_CHECKING:
    from rich.table import Table

ckpt_app = typer.Typer(help="Inspect and prune checkpoints.", no_args_is_help=True)
PathArg = typer.Argument(
    ..., help="A run's output directory, its checkpoints directory, or one checkpoint."
)


def inspect(
    path: Path = PathArg,
    verify: bool = typer.Option(
        False,
        "--verify",
        help="Also hash every file and compare with meta.json (reads all the bytes; slower).",
    ),
    output_format: OutputFormat = format_option("tables"),
) -> None:
    """Show step, tokens, loss, size, parameters and status of every checkpoint found.

    With the run's metrics JSONL (logging.json_file) next to the checkpoints, also its loss
    history: a sparkline, the first, last and lowest loss, and the eval losses.
    """
    from speedtronic.checkpoint.inspection import inspect_path, tokenizer_text

    report = inspect_path(path, verify=verify)
    if output_format is OutputFormat.json:
        print(json_text(report))
        return
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 160)  # pipes: don't squeeze to 80
    console.print(_overview(report))
    if report["history"] is not None:
        console.print(_history(report["history"]))
    if any(c["status"] == "unverified" for c in report["checkpoints"]):
        console.print(
            "unverified: files and sizes match meta.json, hashes not checked (use --verify)",
            highlight=False,
        )
    chosen = _latest_entry(report)
    if chosen:
        console.print(_modules(chosen))
        facts = ", ".join(f"{k}={v}" for k, v in chosen["config_facts"].items())
        dtypes = ", ".join(f"{k} x{v}" for k, v in chosen["dtypes"].items())
        console.print(f"{chosen['name']}: dtypes {dtypes}", highlight=False)
        console.print(f"config: {facts or 'not recorded'}", highlight=False)
        console.print(f"tokenizer: {tokenizer_text(chosen)}", highlight=False)
        for line in _sets_lines(chosen.get("eval_sets")):
            console.print(line, highlight=False)


def _sets_lines(sets: object) -> list[str]:
    """One line per held-out set the checkpoint recorded (eval.sets); meta.json is data."""
    if not isinstance(sets, dict):
        return []
    lines = []
    for name, f in sets.items():
        if isinstance(f, dict) and all(isinstance(f.get(k), (int, float)) for k in _SET_KEYS):
            lines.append(
                f"held-out set {name}: bits/byte {f['bits_per_byte']:.4f}, loss "
                f"{f['loss']:.4f} (step {f['step']})"
            )
    return lines


_SET_KEYS = ("step", "loss", "bits_per_byte")


def prune(
    path: Path = typer.Argument(
        ..., help="A run's output directory or its checkpoints directory (not one checkpoint)."
    ),
    keep: int = typer.Option(
        ..., "--keep", help="How many of the newest complete checkpoints to keep."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only show what would be deleted."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Delete without asking."),
) -> None:
    """Delete all but the newest --keep complete checkpoints.

    Never deletes the one latest.json points to, nor damaged or incomplete ones.
    """
    from speedtronic.checkpoint.inspection import apply_prune, left_alone, prune_plan

    plan, kept = prune_plan(path, keep)
    for item in kept:
        print(f"keeping {item['path']}: {item['reason']}")
    for item in left_alone(path):
        print(f"leaving {item['path']}: {item['status']} ({item['problem']}); delete it by hand")
    if not plan:
        print("nothing to prune")
        return
    verb = "would delete" if dry_run else "will delete"
    for item in plan:
        print(f"{verb} {item['path']} ({size_text(item['size_bytes'])})")
    print(f"total: {len(plan)} checkpoint(s), {size_text(sum(i['size_bytes'] for i in plan))}")
    if dry_run:
        return
    if not yes:
        if not sys.stdin.isatty():
            raise ConfigError("ckpt prune: not a terminal, so cannot ask; pass --yes to delete")
        if not typer.confirm("Delete these checkpoints?", default=False):
            raise typer.Exit(1)
    apply_prune(plan)
    print(f"deleted {len(plan)} checkpoint(s)")


_STATUS_STYLE = {"ok": "[green]ok[/]", "unverified": "[yellow]unverified[/]"}


def _overview(report: dict) -> Table:
    from rich.table import Table

    table = Table(title=f"checkpoints in {report['root']}", title_justify="left")
    columns = ("name", "latest", "status", "step", "tokens", "samples", "loss", "created")
    for column in (*columns, "size", "params"):
        table.add_column(column, justify="right" if column not in columns[:3] else "left")
    for c in report["checkpoints"]:
        status = _STATUS_STYLE.get(c["status"], f"[red]{c['status']}[/]: {c['problem']}")
        table.add_row(
            c["name"],
            "*" if c["is_latest"] else "",
            status,
            count_text(c["step"]),
            count_text(c["tokens"]),
            count_text(c["samples"]),
            "-" if c["loss"] is None else f"{c['loss']:.4f}",
            (c["created_at"] or "-")[:19],
            size_text(c["size_bytes"]),
            count_text(c["param_count"]),
        )
    return table


def _modules(entry: dict) -> Table:
    from rich.table import Table

    table = Table(
        title=f"{entry['name']}: parameters by module", title_justify="left", min_width=48
    )
    for column in ("module", "params", "bytes"):
        table.add_column(column, justify="left" if column == "module" else "right")
    for name, info in entry["params_by_module"].items():
        table.add_row(name, count_text(info["params"]), size_text(info["size_bytes"]))
    return table


def _history(history: dict) -> Table:
    """One row per series (loss, eval loss): sparkline, first, last, lowest, points."""
    from rich.table import Table

    cut = " (long file: its start and its end read)" if history["truncated"] else ""
    table = Table(title=f"loss history from {history['path']}{cut}", title_justify="left")
    for column in ("series", "history", "first", "last", "min", "points"):
        table.add_column(column, justify="left" if column in ("series", "history") else "right")
    for label, name in (("loss", "loss"), ("eval loss", "eval_loss")):
        if not history[f"{name}_points"]:
            continue
        low = history[f"min_{name}"]
        table.add_row(
            label,
            history[f"{name}_sparkline"],
            _loss(history[f"first_{name}"]),
            f"{_loss(history[f'last_{name}'])} @ {history[f'last_{name}_step']}",
            "-" if low is None else f"{low:.4f} @ {history[f'min_{name}_step']}",
            count_text(history[f"{name}_points"]),
        )
    if not table.rows:
        table.add_row("-", "no train_step or eval records", "", "", "", "0")
    return table


def _loss(value: float | None) -> str:
    return "nan" if value is None else f"{value:.4f}"


def _latest_entry(report: dict) -> dict | None:
    """The checkpoint to detail: latest.json's if usable, else the newest usable one."""
    entries = [c for c in report["checkpoints"] if c["status"] in ("ok", "unverified")]
    latest = [c for c in entries if c["is_latest"]]
    return (latest or entries[-1:] or [None])[0]


def register(app: typer.Typer) -> None:
    short = "Show every checkpoint's step, tokens, loss, size and status."
    ckpt_app.command(short_help=short)(handle_errors(inspect))
    ckpt_app.command()(handle_errors(prune))
    app.add_typer(ckpt_app, name="ckpt")

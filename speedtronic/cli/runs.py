"""``speedtronic runs [DIR]...`` and ``speedtronic runs compare RUN RUN...``: every run in a
table, and several runs side by side (the config keys that differ, the loss curves).

One command with two forms, not a group: a group's own arguments cannot be a list of
directories beside its subcommands, so ``compare`` as the first word picks the second form.
Reading lives in ``speedtronic.results`` (``listing``, ``compare``: stdlib) and the picture in
``results.plot`` (matplotlib, the ``plot`` extra); this module parses and draws. A Rich table
on a terminal, plain columns in a pipe.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Any

import typer

from speedtronic.cli.errors import handle_errors
from speedtronic.cli.jsonout import json_text
from speedtronic.cli.options import JSON_SCHEMA_VERSION, OutputFormat, format_option
from speedtronic.errors import ConfigError

DEFAULT_DIR = Path("runs")
HEADERS = ("name", "status", "steps", "tokens", "time", "params", "optimizer", "loss")
HEADERS += ("eval_loss", "bpb", "tokens/s", "role")
OWN_LOSS_NOTE = (
    "* a DumbDiLoCo node's own training loss (its local weights between rounds), not the "
    "fleet's model: that is RUN/final_global, which speedtronic eval RUN/final_global --text "
    "FILE scores"
)


class XAxis(str, Enum):
    """``runs compare --x``: what the curves are drawn against."""

    tokens = "tokens"
    steps = "steps"
    time = "time"


def runs(
    args: list[str] = typer.Argument(
        None,
        metavar="DIR | compare RUN RUN",
        help="Directories to list the runs under (default: runs/), searched four levels "
        "deep; or 'compare' and two or more run output directories.",
        show_default=False,
    ),
    sort: str = typer.Option(
        None,
        "--sort",
        metavar="COLUMN",
        help="List: order the rows by this column, smallest first (name, status, steps, "
        "tokens, time, params, optimizer, loss, eval_loss, bpb, tokens_per_s, role).",
    ),
    x: XAxis = typer.Option(
        None,
        "--x",
        help="Compare: draw the curves against tokens (default), optimizer steps or "
        "training seconds (time).",
    ),
    plot: Path = typer.Option(
        None,
        "--plot",
        metavar="FILE",
        help="Compare: also draw the curves into FILE (.png or .svg), every logged point "
        "against a log-scaled x; needs the plot extra (pip install 'speedtronic[plot]').",
    ),
    smooth: float = typer.Option(
        None,
        "--smooth",
        metavar="WEIGHT",
        help="With --plot: smooth each curve as W&B does (exponential moving average, "
        "debiased), WEIGHT from 0 (none, the default) to below 1; the logged points stay, faint.",
    ),
    log_y: bool = typer.Option(False, "--log-y", help="With --plot: a log-scaled y axis."),
    linear_x: bool = typer.Option(
        False, "--linear-x", help="With --plot: a linear x axis instead of the log-scaled one."
    ),
    output_format: OutputFormat = format_option("a table, or the differing keys and curves"),
) -> None:
    """List every run: status, steps, tokens, time, loss, bits per byte; or compare runs.

    'runs compare RUN RUN' shows the config keys that differ between the runs and their
    train and eval loss curves (bits per byte when their tokenizers differ).
    """
    words = list(args or [])
    if words[:1] == ["compare"]:
        if sort is not None:
            raise ConfigError("--sort: only for listing runs, not with compare")
        options = _plot_options(plot, smooth, log_y, linear_x)
        _compare(
            [Path(w) for w in words[1:]], (x or XAxis.tokens).value, plot, options, output_format
        )
        return
    if x is not None or plot is not None or _plot_only(smooth, log_y, linear_x):
        raise ConfigError("--x, --plot and its options: only with 'runs compare RUN RUN'")
    _list([Path(w) for w in words] or [DEFAULT_DIR], sort, output_format)


def _list(roots: list[Path], sort: str | None, output_format: OutputFormat) -> None:
    from speedtronic.results.listing import list_runs, sort_rows

    if sort is not None:
        sort_rows([], sort)  # a bad column is refused before any directory is read
    rows = list_runs(roots)
    rows = sort_rows(rows, sort) if sort else rows
    if output_format is OutputFormat.json:
        print(json_text({"schema_version": JSON_SCHEMA_VERSION, "runs": rows}))
        return
    for row in rows:
        if row["problem"]:
            print(f"speedtronic: warning: {row['name']}: {row['problem']}", file=sys.stderr)
    if not rows:
        print(f"no runs found under {', '.join(map(str, roots))}", file=sys.stderr)
        return
    cells = [_cells(row) for row in rows]
    if sys.stdout.isatty():
        _rich_table(cells)
    else:
        _plain_table(cells)
    if any(_own_loss(row) for row in rows):
        print(OWN_LOSS_NOTE)


def _cells(row: dict[str, Any]) -> list[str]:
    from speedtronic.cli.options import count_text

    status = row["status"] + ("!" if row["problem"] else "")
    role = row["role"] or "-"
    if row["outer_step"] is not None:
        role += f" @{row['outer_step']}"
    return [
        row["name"],
        status,
        count_text(row["steps"]),
        count_text(row["tokens"]),
        _duration(row["train_s"]),
        count_text(row["params"]),
        row["optimizer"] or "-",
        _number(row["final_loss"]) + ("*" if _own_loss(row) else ""),
        _number(row["best_eval_loss"]),
        _number(row["bits_per_byte"]),
        "-" if row["tokens_per_s"] is None else f"{row['tokens_per_s']:,.0f}",
        role,
    ]


def _own_loss(row: dict[str, Any]) -> bool:
    """A DumbDiLoCo node's loss: its local weights' between rounds, not the fleet's model."""
    return bool(row["role"]) and row["final_loss"] is not None


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def _plain_table(cells: list[list[str]]) -> None:
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(HEADERS)]
    for line in [list(HEADERS), *cells]:
        text = "  ".join(
            c.ljust(w) if i in (0, 1, 6, 11) else c.rjust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        )
        print(text.rstrip())


def _rich_table(cells: list[list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i in (0, 1, 6, 11) else "right")
    for row in cells:
        table.add_row(*row)
    Console().print(table)


def register(app: typer.Typer) -> None:
    short = (
        "List every run (status, steps, loss, bits per byte), or compare runs' configs and curves."
    )
    app.command(short_help=short)(handle_errors(runs))


def _plot_only(smooth: float | None, log_y: bool, linear_x: bool) -> bool:
    return smooth is not None or log_y or linear_x


def _plot_options(plot: Path | None, smooth: float | None, log_y: bool, linear_x: bool) -> Any:
    """The picture's options, checked before any run is read (None without --plot)."""
    if plot is None:
        if _plot_only(smooth, log_y, linear_x):
            raise ConfigError("--smooth, --log-y and --linear-x: only with --plot FILE")
        return None
    from speedtronic.results.plot import PlotOptions

    options = PlotOptions(smooth=smooth or 0.0, log_x=not linear_x, log_y=log_y)
    options.check()
    return options


def _compare(
    paths: list[Path], x: str, plot: Path | None, options: Any, output_format: OutputFormat
) -> None:
    from speedtronic.results.compare import compare_runs, thin_series

    doc = compare_runs(paths, x)
    for warning in doc["warnings"]:
        print(f"speedtronic: warning: {warning}", file=sys.stderr)
    if plot is not None:
        from speedtronic.results.plot import write_plot

        write_plot(plot, doc, options)
        print(f"wrote {plot}", file=sys.stderr)
    doc = thin_series(doc)  # every point went into the picture; 256 a series are shown
    if output_format is OutputFormat.json:
        print(json_text(doc))
        return
    for line in _compare_lines(doc):
        print(line)


def _compare_lines(doc: dict[str, Any]) -> list[str]:
    """The runs by number, the differing keys, one character plot per series kind, and a
    sparkline per series."""
    from speedtronic.observe.history import sparkline
    from speedtronic.results.compare import MARKS, X_LABELS, char_plot, short

    lines = [f"{MARKS[i]} = {r['name']} ({r['status']})" for i, r in enumerate(doc["runs"])]
    keys = doc["differing_keys"]
    lines.append(f"config keys that differ: {len(keys)}")
    for key, values in keys.items():
        lines.append(f"  {key}: " + " | ".join(_value(v) for v in values))
    if doc["note"]:
        lines.append(f"note: {doc['note']}")
    what = "bits per byte" if doc["metric"] == "bits_per_byte" else "loss"
    groups: dict[tuple, list] = {}
    for s in doc["series"]:
        groups.setdefault((s["kind"], s["set"]), []).append(s)
    for (kind, name), series in groups.items():
        where = f" ({name})" if name else ""
        lines += ["", f"{kind} {what}{where} against {X_LABELS[doc['x']]}", *char_plot(series)]
        for s in series:
            ys = [p[1] for p in s["points"]]
            lines.append(
                f"  {MARKS[s['index'] % len(MARKS)]} {sparkline(ys, 30)} "
                f"{ys[0]:.4f} -> {ys[-1]:.4f} (min {min(ys):.4f})"
            )
    for final in doc["finals"]:
        at = "-" if final["x"] is None else f"{short(final['x'])} fleet {X_LABELS[doc['x']]}"
        loss = "not measured" if final["loss"] is None else f"{final['loss']:.4f}"
        lines.append(
            f"final global of {final['fleet']}: outer step {final['outer_step']} at {at}, "
            f"loss {loss} ({final['path']})"
        )
    if not groups:
        lines.append("no curves: no run logged a loss (summary.json or logging.json_file)")
    return lines


def _value(value: object) -> str:
    text = "-" if value is None else str(value)
    return text if len(text) <= 40 else text[:37] + "..."

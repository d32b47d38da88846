"""``speedtronic bench``: what this machine can do, and how close training gets to it.

Parses the options, runs ``speedtronic.bench.run_bench`` (imported in the command body, so
``--help`` stays free of torch), shows progress on stderr (a Rich progress bar on a terminal,
one plain line per stage otherwise) and prints the result to stdout: a Rich table with a
verdict per line, or the JSON document with ``--format json``. Rich is imported by the code
that draws, not at the top: ``--help`` and shell completion load this module at every TAB.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from speedtronic.cli.errors import handle_errors
from speedtronic.cli.jsonout import json_text
from speedtronic.cli.options import ConfigOpt, OutputFormat, SetOpt, format_option, load_config
from speedtronic.errors import ConfigError

if TYPE_CHECKING:
    from rich.table import Table

LEVEL_STYLE = {"ok": "green", "warn": "yellow", "info": ""}


def bench(
    config: Path | None = ConfigOpt,
    device: str | None = typer.Option(
        None,
        "--device",
        help="Device to measure: auto, cpu, cuda, cuda:N or mps (run.device). "
        "Default: the config's device.",
    ),
    output_format: OutputFormat = format_option("a table with a verdict per line"),
    quick: bool = typer.Option(
        False,
        "--quick",
        help="Shorter timings: under 30 seconds (about 20) on a 2-core CPU with the smoke config, "
        "at the price of noisier figures.",
    ),
    scratch_dir: Path | None = typer.Option(
        None,
        "--scratch-dir",
        help="Existing directory for the temporary checkpoint that measures save and load "
        "bandwidth (deleted afterwards). Default: the system temporary directory.",
    ),
    overrides: list[str] | None = SetOpt,
    matmul_size: int | None = typer.Option(None, "--matmul-size", hidden=True),
    min_time: float | None = typer.Option(None, "--min-time", hidden=True),
    rounds: int | None = typer.Option(None, "--rounds", hidden=True),
) -> None:
    """Measure the device's limits and the configured model's training speed against them."""
    for name, value in (("--matmul-size", matmul_size), ("--min-time", min_time)):
        if value is not None and value <= 0:
            raise ConfigError(f"{name}: must be > 0 (got {value})")
    if rounds is not None and rounds < 1:
        raise ConfigError(f"--rounds: must be >= 1 (got {rounds})")
    sets = [f"run.device={device}"] if device is not None else []
    cfg = load_config(config, sets + list(overrides or []))

    from speedtronic.bench import BenchOptions, run_bench
    from speedtronic.runtime import check_model, check_seq_len

    check_seq_len(cfg)  # a bad model config fails now, not after minutes of measuring
    check_model(cfg)

    options = BenchOptions(
        quick=quick,
        matmul_size=matmul_size,
        min_time_s=min_time,
        rounds=rounds,
        scratch_dir=str(scratch_dir) if scratch_dir is not None else None,
    )
    with make_progress() as progress:
        doc = run_bench(cfg, options, progress.on_event)
    if output_format is OutputFormat.json:
        print(json_text(doc))
        return
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 160)  # pipes: don't squeeze to 80
    console.print(render_table(doc))


# ---- progress (stderr) ------------------------------------------------------------------


def make_progress() -> Any:
    return BarProgress() if sys.stderr.isatty() else PlainProgress()


class PlainProgress:
    """One line per stage on stderr, as it starts (some stages take a while)."""

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        if event == "stage_start":
            label = f"[{payload['index']}/{payload['total']}] {payload['label']}"
            print(f"bench {label} ...", file=sys.stderr, flush=True)
        elif event in ("warning", "notice"):
            print(f"{event}: {payload['message']}", file=sys.stderr, flush=True)

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class BarProgress:
    """A transient Rich progress bar over the stages; warnings print above it."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
            refresh_per_second=4,
        )
        self.task: Any = None

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        if event == "stage_start":
            description = f"bench: {payload['label']}"
            if self.task is None:
                self.task = self.progress.add_task(description, total=payload["total"])
            self.progress.update(self.task, description=description)
        elif event == "stage_end" and self.task is not None:
            self.progress.update(self.task, completed=payload["index"])
        elif event in ("warning", "notice"):
            style = "yellow" if event == "warning" else "cyan"
            self.progress.console.print(f"[{style}]{event}:[/] {payload['message']}")

    def __enter__(self) -> BarProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()


# ---- the table (stdout) -----------------------------------------------------------------


def render_table(doc: dict[str, Any]) -> Table:
    from rich.table import Table

    cfg, device = doc["config"], doc["device"]
    title = (
        f"speedtronic bench - {cfg['name']}: {cfg['model']} {cfg['params'] / 1e6:.2f}M params, "
        f"{cfg['tokens_per_step']:,} tokens/step, on {device['backend']} "
        f"({device['threads']} threads, torch {device['torch_version']})"
    )
    table = Table(title=title, title_justify="left", caption=_caption(doc), caption_justify="left")
    table.add_column("line")
    table.add_column("measured")
    table.add_column("verdict")
    notes: dict[str, list[dict[str, str]]] = {}
    for verdict in doc["verdicts"]:
        notes.setdefault(verdict["row"], []).append(verdict)
    for row, label, text in table_rows(doc):
        found = notes.get(row, [])
        verdict = "; ".join(
            f"[{LEVEL_STYLE[v['level']]}]{_escape(v['message'])}[/]"
            if LEVEL_STYLE[v["level"]]
            else _escape(v["message"])
            for v in found
        )
        table.add_row(label, _escape(text), verdict)
    return table


def _caption(doc: dict[str, Any]) -> str:
    mode = "quick" if doc["quick"] else "full"
    return (
        f"{mode} run, {doc['elapsed_s']:.1f} s; warm-up excluded, device synchronised before "
        "every clock read; --format json for every figure"
    )


def _escape(text: str) -> str:
    return text.replace("[", "\\[")


def table_rows(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(verdict row id, line label, measured text) for every line of the table."""
    rows = [("device", "device", _device_text(doc["device"]))]
    for name, peak in doc["peaks"]["matmul"].items():
        if peak:
            text = f"{peak['tflops']:.3g} TFLOP/s ({peak['size']}x{peak['size']}, "
            rows.append((f"matmul.{name}", f"matmul {name}", text + _median(peak)))
    copy = doc["peaks"]["memory_copy"]
    text = f"{copy['gb_per_s']:.1f} GB/s read+write ({copy['bytes'] / 2**20:.0f} MiB buffer)"
    rows.append(("memory_copy", "memory copy", text))
    configured = doc["model"]["configured"]
    for mode, run in doc["model"]["modes"].items():
        label = f"model {mode}" + (" (configured)" if mode == configured else "")
        rows.append((f"model.{mode}", label, _model_text(run)))
    for mode in doc["model"].get("skipped", {}):  # too slow here to measure (emulated)
        rows.append((f"model.{mode}", f"model {mode}", "not measured"))
    rows.append(("overhead", "engine overhead", _overhead_text(doc["overhead"])))
    rows.append(("data", "data loader", _data_text(doc["data"])))
    rows.append(("checkpoint", "checkpoint", _checkpoint_text(doc["checkpoint"])))
    rows.append(("compile", "torch.compile", _compile_text(doc["compile"])))
    return rows


def _median(peak: dict[str, Any]) -> str:
    return f"median {peak['tflops_median']:.3g})"


def _device_text(device: dict[str, Any]) -> str:
    caps = device["capabilities"]
    memory = f"{device['memory_gb']:.0f} GB" if device["memory_gb"] else "memory unknown"
    if device["backend"] == "cuda":
        kinds = ", ".join(k for k in ("bf16", "fp16", "tf32") if caps[k])
        extra = f"sm {caps['compute_capability']}, {kinds}, CUDA {device['cuda_version']}"
    else:
        isa = " ".join(f.upper().replace("_", "-") for f in caps["isa"]) or "no ISA flags read"
        extra = f"{isa} (torch kernels: {caps['cpu_capability'] or 'n/a'})"
    return f"{device['name']}, {memory}, {device['threads']} threads; {extra}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _model_text(run: dict[str, Any]) -> str:
    memory = "-" if run["peak_memory_gb"] is None else f"{run['peak_memory_gb']:.2f} GB"
    return (
        f"{run['tokens_per_s']:,.0f} tok/s, {run['step_time_s'] * 1000:,.1f} ms/step, "
        f"MFU {_pct(run['mfu_measured_peak'])} measured / {_pct(run['mfu_vendor_peak'])} "
        f"vendor, peak mem {memory}, optimizer {_pct(run.get('optimizer_share'))} of a step"
    )


def _overhead_text(o: dict[str, Any]) -> str:
    return (
        f"{o['precision']}: Trainer {o['trainer_tokens_per_s']:,.0f} vs raw loop "
        f"{o['raw_tokens_per_s']:,.0f} tok/s = {o['ratio']:.3f} "
        f"(rounds {o['ratio_min']:.2f}-{o['ratio_max']:.2f})"
    )


def _data_text(d: dict[str, Any]) -> str:
    wait = "" if d["data_wait_share"] is None else f"; waits {d['data_wait_share']:.1%}"
    return (
        f"{d['tokens_per_s']:,.0f} tok/s ({d['source']}, {d['num_workers']} workers) vs "
        f"{d['consumption_tokens_per_s']:,.0f} consumed{wait}"
    )


def _checkpoint_text(c: dict[str, Any]) -> str:
    return (
        f"{c['bytes'] / 1e6:,.1f} MB: save {c['save_s']:.3g} s ({c['save_gb_per_s']:.2f} GB/s), "
        f"load {c['load_s']:.3g} s ({c['load_gb_per_s']:.2f} GB/s)"
    )


def _compile_text(c: dict[str, Any]) -> str:
    if not c["enabled"]:
        return "off"
    if c["fell_back"]:
        return f"failed: {c['message']}"
    return (
        f"{c['compiled_tokens_per_s']:,.0f} vs {c['eager_tokens_per_s']:,.0f} tok/s eager; "
        f"compiling took {c['compile_s']:.1f} s"
    )


def register(app: typer.Typer) -> None:
    short = "Measure this device, and the config's training speed on it."
    app.command(short_help=short)(handle_errors(bench))

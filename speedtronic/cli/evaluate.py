"""``speedtronic eval``: a trained run's model scored on texts (bits per byte) and tasks.

``--text FILE`` (repeatable) reports loss and bits per byte over each file by the windowing
rule of ``speedtronic.evaluate.text``; ``--task hellaswag --data FILE`` scores a multiple-choice
task file (``acc``, ``acc_norm``); ``--window`` (default: the run's training ``seq_len``) is
the scored sequence length. The work is ``speedtronic.evaluate``'s; torch and the engine
load in the command body, so ``--help`` imports only these option declarations. Results go to
stdout, progress to stderr.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import typer

from speedtronic.cli.errors import handle_errors
from speedtronic.cli.jsonout import json_text
from speedtronic.cli.options import JSON_SCHEMA_VERSION, OutputFormat, format_option
from speedtronic.errors import ConfigError, SpeedtronicError

# A text is tokenized whole and every token held as a window: 64 MiB is a big held-out set
# already, and the most a laptop should be asked to hold for it.
MAX_TEXT_BYTES = 64 << 20


def evaluate(
    run: Path = typer.Argument(
        ...,
        help="A run's output directory (its newest usable checkpoint), its checkpoints "
        "directory, or one checkpoint directory (model.safetensors + meta.json, e.g. a "
        "DumbDiLoCo final_global).",
    ),
    text: list[Path] = typer.Option(
        [],
        "--text",
        metavar="FILE",
        help="A UTF-8 text file (at most 64 MiB) to report loss and bits per byte over; repeat "
        "for several.",
    ),
    stride: int | None = typer.Option(
        None,
        "--stride",
        min=1,
        help="Tokens scored per window of --text (each given the window's other tokens as "
        "context). Default: the window, i.e. non-overlapping windows as in training.",
    ),
    window: int | None = typer.Option(
        None,
        "--window",
        min=1,
        help="Tokens per scored sequence, context included. Default: the run's training "
        "seq_len (the blocks training read); an imported model's full context. At most the "
        "model's context.",
    ),
    task: str | None = typer.Option(
        None, "--task", help="A multiple-choice task to score: hellaswag (needs --data)."
    ),
    data: str | None = typer.Option(
        None,
        "--data",
        help="The task's file: JSONL, one object per line with ctx, endings and label; or "
        "hf://datasets/OWNER/NAME[@REVISION]/PATH of such a file, downloaded once into the user "
        "cache (pin @SHA to work offline afterwards).",
    ),
    limit: int | None = typer.Option(
        None, "--limit", min=1, help="Score only the task file's first N items."
    ),
    batch_size: int = typer.Option(
        16,
        "--batch-size",
        min=1,
        help="Sequences per forward pass at most (more is faster, uses memory); fewer where "
        "their logits would pass 256 MB (a long context, a large vocabulary).",
    ),
    per_example: bool = typer.Option(
        False, "--per-example", help="Also report each task item's predictions (json: examples)."
    ),
    device: str = typer.Option(
        "auto", "--device", help="Device to evaluate on: auto, cpu, cuda, cuda:N or mps."
    ),
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        help="'byte' or a tokenizers JSON file, for a checkpoint that does not record its "
        "tokenizer. Default: the checkpoint's.",
    ),
    output_format: OutputFormat = format_option("one line per text and per task"),
) -> None:
    """Score a trained run's model: loss and bits per byte on texts, accuracy on a task.

    Bits per byte counts the bytes of the text, so runs with different tokenizers compare.
    """
    _check_usage(text, task, data)
    from speedtronic.evaluate.tasks import read_task

    items = read_task(task, _task_file(data), limit) if task is not None else None  # fail first
    texts = [(path, _read_text(path)) for path in text]
    report = _run(run, texts, stride, window, task, items, batch_size, device, tokenizer)
    if output_format is OutputFormat.json:
        if not per_example:
            report.pop("examples", None)
        print(json_text(report))
        return
    _print_text(report, per_example)


def _check_usage(text: list[Path], task: str | None, data: str | None) -> None:
    if not text and task is None:
        raise ConfigError("nothing to evaluate: give --text FILE and/or --task hellaswag --data")
    if task is not None and data is None:
        raise ConfigError(f"--task {task}: needs --data FILE (the task's JSONL file)")
    if data is not None and task is None:
        raise ConfigError("--data: needs --task NAME saying what the file holds")


def _task_file(data: str | None) -> Path:
    if data is None or not data.startswith("hf://"):
        return Path(str(data))
    from speedtronic.data.ingest.hub_source import cached_dataset_file

    path, pinned = cached_dataset_file(data)
    _note(f"--data: {pinned} (cached at {path})")
    return path


def _read_text(path: Path) -> str:
    from speedtronic.readlimit import read_text

    return read_text(path, MAX_TEXT_BYTES, "--text", ConfigError)


def _run(run_path, texts, stride, window, task, items, batch_size, device, tokenizer) -> dict:
    from speedtronic.evaluate.runner import choose_window, open_scorer

    run, scorer = open_scorer(run_path, tokenizer, device, batch_size, _note, window)
    report: dict[str, Any] = {
        "schema_version": JSON_SCHEMA_VERSION,
        "checkpoint": str(run.checkpoint),
        "step": run.step,
        "window": scorer.window,
        "window_from": choose_window(run, window)[1],
    }
    tok = run.require_tokenizer()
    if texts:
        report["texts"] = [_score_text(scorer, tok, path, body, stride) for path, body in texts]
    if items is not None:
        report.update(_score_task(scorer, tok, task, items))
    return report


def _score_text(scorer, tok, path: Path, body: str, stride: int | None) -> dict:
    from speedtronic.evaluate.text import score_text, windows

    count = len(windows(list(tok(body)), scorer.window, stride)) if body else 0
    started = time.perf_counter()
    result = score_text(scorer, tok, body, stride, _progress(f"{path}", count))
    seconds = time.perf_counter() - started
    _require_finite([result.loss], f"--text {path}")
    return {"path": str(path), **result.as_dict(), "stride": stride or scorer.window, "s": seconds}


def _score_task(scorer, tok, task: str, items) -> dict:
    from speedtronic.evaluate.choice import score_choices

    count = sum(len(item.choices) for item in items)
    started = time.perf_counter()
    result = score_choices(scorer, tok, items, _progress(task, count))
    _require_finite([p for e in result.examples for p in e["logprobs"]], f"--task {task}")
    return {
        "task": task,
        "n": result.n,
        "acc": result.acc,
        "acc_norm": result.acc_norm,
        "s": time.perf_counter() - started,
        "examples": result.examples,
    }


def _require_finite(values: list[float], what: str) -> None:
    """A NaN or infinite score has no meaning (a NaN accuracy reads as 0.0): refused, never
    reported, and never written into JSON, which has no NaN."""
    if not all(math.isfinite(v) for v in values):
        raise SpeedtronicError(
            f"{what}: the model gives non-finite log-probabilities (NaN or infinity); its "
            "weights hold NaN/inf or its logits overflow at this precision",
            hint="an earlier checkpoint (a step_* directory under checkpoints/) may be sound",
        )


def _progress(label: str, total: int):
    """Plain progress lines on stderr, about every tenth of the way."""
    done, shown = 0, 0

    def step(n: int) -> None:
        nonlocal done, shown
        done += n
        if done * 10 // max(total, 1) > shown or done == total:
            shown = done * 10 // max(total, 1)
            _note(f"{label}: {done}/{total} sequences scored")

    return step


def _print_text(report: dict, per_example: bool) -> None:
    from speedtronic.evaluate.runner import WINDOW_FROM

    window = f"window {report['window']}: {WINDOW_FROM[report['window_from']]}"
    where = f"{report['checkpoint']} (step {report['step']}, {window})"
    print(f"evaluated {where}")
    for t in report.get("texts", []):
        print(
            f"text {t['path']}: bits per byte {t['bits_per_byte']:.4f} | loss {t['loss']:.4f} | "
            f"{t['tokens']} tokens from {t['bytes']} bytes (stride {t['stride']})"
        )
    if "task" in report:
        print(
            f"task {report['task']}: n {report['n']} | acc {report['acc']:.4f} | "
            f"acc_norm {report['acc_norm']:.4f}"
        )
    for e in report.get("examples", []) if per_example else []:
        print(f"  {e['where']}: label {e['label']} pred {e['pred']} pred_norm {e['pred_norm']}")


def _note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def register(app: typer.Typer) -> None:
    short = "Score a run's model: bits per byte on texts, accuracy on a multiple-choice task."
    app.command("eval", short_help=short)(handle_errors(evaluate))

"""``speedtronic data tokenizer train``: a byte-level BPE tokenizer of one's own, and its figures.

The work is ``speedtronic.data.tokenizer_train``'s (imported in the command's body: ``--help``
and completion stay light); this module owns the options and the report's wording.
"""

from __future__ import annotations

from pathlib import Path

import typer

from speedtronic.cli.errors import handle_errors
from speedtronic.cli.jsonout import json_text
from speedtronic.cli.options import (
    JSON_SCHEMA_VERSION,
    OutputFormat,
    format_option,
    text_suffix_option,
)

tokenizer_app = typer.Typer(help="Make a tokenizer of your own.", no_args_is_help=True)
MAX_DOCUMENT_BYTES = 64 << 20  # = speedtronic.data.ingest.formats.MAX_DOCUMENT_BYTES


def train(
    sources: list[str] = typer.Argument(
        ...,
        help="What to train on, read as data tokenize reads it: .txt, .jsonl, .jsonl.gz, "
        ".jsonl.zst or .parquet files, directories (their files of those kinds; others with "
        "--text-suffix), globs.",
    ),
    out: Path = typer.Argument(
        ..., help="The tokenizer file to write (a .json name; use it as --tokenizer OUT)."
    ),
    vocab_size: int = typer.Option(
        ...,
        "--vocab-size",
        help="Ids in all: 256 bytes + the special tokens + merges (at most 2**20).",
    ),
    compare: str | None = typer.Option(
        None,
        "--compare",
        help="Another tokenizer.json (e.g. GPT-2's) to measure on the same held-out text.",
    ),
    special: list[str] = typer.Option(
        [],
        "--special",
        metavar="TOKEN",
        help="A special token to add after <|endoftext|> (the document separator, id 0); "
        "repeatable. Delimited as ordinary text is not: <|name|>, <name> or [NAME], no spaces "
        "inside (any text holding it encodes as that token).",
    ),
    held_out: float = typer.Option(
        0.01,
        "--held-out",
        help="Share of documents not trained on, which the compression is measured on (chosen "
        "by a hash of each document, the rule of data tokenize --val-fraction).",
    ),
    column: str = typer.Option(
        "text", "--column", help="The JSON Lines field or Parquet column holding each document."
    ),
    min_frequency: int = typer.Option(
        2, "--min-frequency", help="Merge only pairs seen at least this many times."
    ),
    max_document_bytes: int = typer.Option(
        MAX_DOCUMENT_BYTES,
        "--max-document-bytes",
        help="Refuse a JSON Lines line or Parquet value longer than this (as data tokenize).",
    ),
    text_suffix: list[str] = text_suffix_option(),
    output_format: OutputFormat = format_option("one summary line"),
) -> None:
    """Train a byte-level BPE tokenizer on SOURCES... into OUT; report bytes per token.

    A document of whitespace alone (an empty .txt) is skipped; sources holding nothing else are
    refused. Exit codes: 0 written, 1 disk failure, 2 bad input.
    """
    from speedtronic.data.ingest.spec import with_text_suffixes
    from speedtronic.data.tokenizer_train import TrainRequest
    from speedtronic.data.tokenizer_train import train as train_tokenizer

    named = with_text_suffixes(tuple(sources), tuple(text_suffix))
    request = TrainRequest(
        named, vocab_size, column, held_out, tuple(special), min_frequency,
        max_document_bytes,
    )  # fmt: skip
    report = train_tokenizer(request, out, compare)
    if output_format == OutputFormat.json:
        print(json_text({"schema_version": JSON_SCHEMA_VERSION, **report}, indent=None))
        return
    print(summary(report))


def summary(report: dict) -> str:
    """The report as lines: what was written, then the compression figures."""
    lines = [
        f"wrote {report['out']} (vocab {report['vocab_size']:,}, separator {report['separator']}"
        f" id 0) from {report['documents']:,} documents, {report['bytes']:,} bytes in "
        f"{report['files']} file(s); tokenize with --tokenizer {report['out']}"
    ]
    if report["vocab_size"] < report["vocab_size_asked"]:
        lines.append(
            f"note: the text allowed {report['vocab_size']:,} ids, not the "
            f"{report['vocab_size_asked']:,} asked (too few pairs seen --min-frequency times)"
        )
    lines.append(_ratio_line(report))
    return "\n".join(lines)


def _ratio_line(report: dict) -> str:
    ours = report["bytes_per_token"]
    if ours is None:
        return (
            "compression: not measured (no document fell in the held-out slice; raise --held-out)"
        )
    held = report["held_out_documents"]
    where = f"on {report['measured_bytes']:,} held-out bytes ({held:,} documents)"
    text = f"compression: {ours:.3f} bytes/token {where}"
    other = report["compare_bytes_per_token"]
    if report["compare"] is not None and other is not None:
        text += f"; {report['compare']}: {other:.3f} bytes/token ({ours / other:.3f}x)"
    return text


def register(data_app: typer.Typer) -> None:
    tokenizer_app.command(short_help="Train a byte-level BPE tokenizer on your corpus.")(
        handle_errors(train)
    )
    data_app.add_typer(tokenizer_app, name="tokenizer")

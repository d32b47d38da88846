"""``speedtronic data tokenize``: corpora (text, JSON Lines, Parquet; local or Hub) into tokens.

The last argument is the output, as with ``cp``: a folder of token shards with a manifest, or a
flat token file when it ends in ``.bin``. Progress is a Rich line on a terminal (documents/s,
tokens/s, bytes, ETA), plain lines every ``PLAIN_EVERY_S`` otherwise, both on stderr; the result
is one line (or ``--format json``) on stdout. Rich and the data modules load in the command's
body: ``--help`` and completion import this one.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

from speedtronic.cli.errors import handle_errors
from speedtronic.cli.jsonout import json_text
from speedtronic.cli.options import (
    JSON_SCHEMA_VERSION,
    OutputFormat,
    format_option,
    load_config,
    text_suffix_option,
)

data_app = typer.Typer(help="Prepare training data.", no_args_is_help=True)
PLAIN_EVERY_S = 10.0
SHARD_TOKENS = 100_000_000  # = speedtronic.data.ingest.plan.SHARD_TOKENS (not imported: numpy)
MAX_DOCUMENT_BYTES = 64 << 20  # = speedtronic.data.ingest.formats.MAX_DOCUMENT_BYTES


def tokenize(
    sources: list[str] = typer.Argument(
        ...,
        help="What to tokenize, in order: .txt, .jsonl, .jsonl.gz, .jsonl.zst or .parquet "
        "files, directories (their files of those kinds, sorted; others with --text-suffix), "
        "globs, or hf://datasets/OWNER/NAME[@REVISION][/PATH-OR-GLOB].",
    ),
    out: str = typer.Argument(
        ...,
        help="The output: a folder of token shards with a manifest, or one flat token file if "
        "it ends in .bin.",
    ),
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        help="'byte', a tokenizers JSON file, a model's tokenizer folder (or an imported run, "
        "its tokenizer/), or one on the Hub (hf://OWNER/MODEL/tokenizer.json). Default: the "
        "config's data.tokenizer, else byte.",
    ),
    column: str = typer.Option(
        "text", "--column", help="The JSON Lines field or Parquet column holding each document."
    ),
    val_fraction: float = typer.Option(
        0.0,
        "--val-fraction",
        help="Share of documents held out as the validation part, chosen by a hash of each "
        "document's text (deterministic). Needs a folder output.",
    ),
    max_tokens: int | None = typer.Option(
        None,
        "--max-tokens",
        help="Stop at the end of the document that reaches this many tokens (no further file is "
        "downloaded).",
    ),
    workers: int | None = typer.Option(
        None, "--workers", help="Tokenizer processes. Default: all cores this process may use."
    ),
    dtype: str = typer.Option(
        "auto",
        "--dtype",
        help="Token dtype: uint16, uint32, or auto (uint16 if the vocabulary fits in 65,536 ids).",
    ),
    shard_tokens: int = typer.Option(
        SHARD_TOKENS, "--shard-tokens", help="Tokens per shard file of a folder output (about)."
    ),
    max_document_bytes: int = typer.Option(
        MAX_DOCUMENT_BYTES,
        "--max-document-bytes",
        help="Refuse a JSON Lines line or Parquet value longer than this many bytes (naming "
        "its file and place), so memory stays bounded whatever the input. Default 64 MiB.",
    ),
    separator: str | None = typer.Option(
        None,
        "--separator",
        help="The token put before each document. Default: the tokenizer's own (its BOS/EOS "
        "template, else an end-of-text token such as <|endoftext|>); byte 0x03 for byte.",
    ),
    cache_dir: Path | None = typer.Option(
        None,
        "--cache-dir",
        help="Keep Hub downloads here and reuse them. Default: delete each source file once "
        "its tokens are written.",
    ),
    chat: bool = typer.Option(
        False,
        "--chat",
        help="The rows hold conversations ([{role, content}, ...]): render each with the "
        "model's chat template (beside --tokenizer, a tokenizer folder or imported run) and "
        "train only on the assistant's turns. Needs --seq-len.",
    ),
    messages_key: str = typer.Option(
        "messages", "--messages-key", help="With --chat: the field or column of each conversation."
    ),
    seq_len: int | None = typer.Option(
        None,
        "--seq-len",
        help="With --chat: the context the model trains at, in tokens. Conversations are packed "
        "whole into examples of this length; a longer one is cut after the last assistant turn "
        "that fits, or dropped.",
    ),
    train_on: str = typer.Option(
        "assistant",
        "--train-on",
        help="With --chat: 'assistant' trains on the assistant turns (their end-of-turn token "
        "included), 'all' on every token.",
    ),
    pad: bool = typer.Option(
        False,
        "--pad",
        help="With --chat: one conversation per example, padded, instead of packing several "
        "into one (attention and positions kept within each).",
    ),
    text_suffix: list[str] = text_suffix_option(),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="Take data.tokenizer from this config file."
    ),
    output_format: OutputFormat = format_option("one summary line"),
) -> None:
    """Tokenize SOURCES... into OUT (train with data.token_path: OUT). Rerun a killed one to resume.

    Exit codes: 0 done (or already done), 1 Hub or disk failure, 2 bad input, 130 interrupted.
    """
    if tokenizer is None and config is not None:
        tokenizer = load_config(config, []).data.tokenizer
    from speedtronic.data.ingest.pipeline import tokenize_corpus
    from speedtronic.data.ingest.plan import Request
    from speedtronic.data.ingest.spec import with_text_suffixes

    named = with_text_suffixes(tuple(sources), tuple(text_suffix))
    request = Request(
        named, tokenizer or "byte", column, val_fraction, max_tokens, dtype,
        shard_tokens, separator, flat=out.endswith(".bin"), max_document_bytes=max_document_bytes,
        chat=chat, messages_key=messages_key, seq_len=seq_len, train_on=train_on, pad=pad,
    )  # fmt: skip
    started = time.monotonic()
    with _Progress() as progress:
        try:
            report = tokenize_corpus(
                request, out, workers, cache_dir, progress.update, progress.notice
            )
        except KeyboardInterrupt:
            print("speedtronic: interrupted; run the same command to continue", file=sys.stderr)
            raise typer.Exit(130) from None
    elapsed = time.monotonic() - started
    _report(report, elapsed, output_format)


def _report(report: dict, elapsed: float, output_format: OutputFormat) -> None:
    shards = sum(len(v) for v in report["shards"].values())
    if output_format == OutputFormat.json:
        keys = ("tokens", "documents", "files", "out", "dtype", "vocab_size", "train_tokens")
        keys += ("val_tokens", "train_documents", "val_documents", "skipped_rows", "input_bytes")
        keys += ("capped", "already_done", "hub_calls", "hub_storage_requests")
        doc = {"schema_version": JSON_SCHEMA_VERSION, **{k: report[k] for k in keys}}
        doc.update(shards=shards, elapsed_s=round(elapsed, 3))
        fresh = elapsed and not report["already_done"]
        doc["tokens_per_s"] = round(report["tokens"] / elapsed, 1) if fresh else None
        if report.get("chat"):
            doc["chat"] = report["chat"]
        print(json_text(doc, indent=None))
        return
    out, flat = report["out"], report["out"].endswith(".bin")
    verb = "already complete:" if report["already_done"] else "wrote"
    split = f"; val {report['val_tokens']:,} tokens" if report["val_tokens"] else ""
    where = "" if flat else f" in {shards} shard(s)"
    print(
        f"{verb} {report['tokens']:,} {report['dtype']} tokens ({report['documents']:,} documents "
        f"from {report['files']} file(s){split}) to {out}{where} (vocab {report['vocab_size']}); "
        f"train on it with data.token_path: {out}"
    )
    chat = report.get("chat")
    if chat:
        fill = chat["chat_tokens"] / max(1, report["tokens"])
        print(
            f"chat: {chat['conversations']:,} conversations ({chat['trained_tokens']:,} tokens "
            f"trained on; {fill:.0%} of the examples' tokens are conversation, the rest padding), "
            f"{chat['cut']:,} cut at a turn to fit, {chat['dropped']:,} dropped "
            f"(first answer too long), {chat['no_assistant']:,} skipped (no assistant turn)"
        )


class _Progress:
    """A Rich progress line on a terminal, plain lines every ``PLAIN_EVERY_S`` otherwise."""

    def __init__(self) -> None:
        self._rich, self._last = None, 0.0
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn())
            columns += (TimeRemainingColumn(), TextColumn("{task.fields[rates]}"))
            self._rich = Progress(*columns, console=Console(stderr=True), transient=True)
            self._task = self._rich.add_task("tokenizing", total=None, rates="")

    def __enter__(self) -> _Progress:
        if self._rich is not None:
            self._rich.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._rich is not None:
            self._rich.stop()

    def update(self, snap: dict) -> None:
        elapsed = max(snap["elapsed_s"], 1e-9)
        rates = (
            f"{snap['documents'] / elapsed:,.0f} docs/s  {snap['tokens'] / elapsed:,.0f} tokens/s"
            f"  file {snap['files_done'] + 1}/{snap['files']}"
        )
        if self._rich is not None:
            total = snap["total_input_bytes"] or None
            self._rich.update(self._task, completed=snap["input_bytes"], total=total, rates=rates)
            return
        now = time.monotonic()
        if now - self._last >= PLAIN_EVERY_S:
            self._last = now
            done, total = snap["input_bytes"], snap["total_input_bytes"]
            eta = (total - done) * elapsed / done if done else 0
            print(
                f"tokenize: {snap['documents']:,} documents, {snap['tokens']:,} tokens, "
                f"{done / 1e6:,.1f} of {total / 1e6:,.1f} MB, {rates}, ETA {eta:,.0f} s",
                file=sys.stderr,
                flush=True,
            )

    def notice(self, text: str) -> None:
        if self._rich is not None:
            self._rich.console.print(text, markup=False, highlight=False)
        else:
            print(f"tokenize: {text}", file=sys.stderr, flush=True)


def register(app: typer.Typer) -> None:
    # short_help: the line in `speedtronic data --help`, where the docstring's is cut at 80
    data_app.command(short_help="Tokenize a text file into a token file (data.token_path).")(
        handle_errors(tokenize)
    )
    from speedtronic.cli import tokenizer_train

    tokenizer_train.register(data_app)
    app.add_typer(data_app, name="data")

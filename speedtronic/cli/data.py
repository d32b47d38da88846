"""``speedtronic data tokenize``: turn a text file into a token file for the fastest data path.

Rich and the data modules load in the command's body: ``--help`` and completion import this one.
"""

from __future__ import annotations

from pathlib import Path

import typer

from speedtronic.cli.errors import handle_errors
from speedtronic.cli.options import load_config
from speedtronic.errors import ConfigError

data_app = typer.Typer(help="Prepare training data.", no_args_is_help=True)


def tokenize(
    text_path: Path = typer.Argument(..., help="The UTF-8 text file to tokenize."),
    out_path: Path = typer.Argument(..., help="Where to write the token file (flat array)."),
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        help="'byte' or a tokenizers JSON file. Default: the config's data.tokenizer, else byte.",
    ),
    dtype: str = typer.Option(
        "auto",
        "--dtype",
        help="Token dtype: uint16, uint32, or auto (uint16 if the vocabulary fits in 65,536 ids).",
    ),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="Take data.tokenizer from this config file."
    ),
) -> None:
    """Write TEXT_PATH tokenized as a flat uint16/uint32 array (use it as data.token_path)."""
    if dtype not in ("auto", "uint16", "uint32"):
        raise ConfigError(f"--dtype: must be auto, uint16 or uint32 (got {dtype!r})")
    if tokenizer is None and config is not None:
        tokenizer = load_config(config, []).data.tokenizer
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    from speedtronic.data.sources import tokenize_file
    from speedtronic.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer or "byte")
    if dtype == "auto":
        dtype = "uint16" if tok.vocab_size <= 65536 else "uint32"
    columns = ("{task.description}", BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, transient=True) as progress:
        task = progress.add_task(f"tokenizing {text_path.name}", total=None)
        count = tokenize_file(
            text_path,
            out_path,
            tok,
            dtype,
            lambda done, total: progress.update(task, completed=done, total=total),
        )
    print(
        f"wrote {count:,} {dtype} tokens to {out_path} (vocab {tok.vocab_size}); "
        f"train on it with data.token_path: {out_path}"
    )


def register(app: typer.Typer) -> None:
    # short_help: the line in `speedtronic data --help`, where the docstring's is cut at 80
    data_app.command(short_help="Tokenize a text file into a token file (data.token_path).")(
        handle_errors(tokenize)
    )
    app.add_typer(data_app, name="data")

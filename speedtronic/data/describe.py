"""What a run trains on, in words: the data source, its files and their sizes (issue 31).

A config could train on synthetic tokens while the user believed it read their file, and no
line said which. ``source_line`` names the source and each file with its size, from the
config and the file system alone (``validate`` prints it without building anything), a
token folder by what its manifest holds (``folder_text``);
``train`` adds the blocks the built dataset holds (``blocks_text``). ``vocab_warning`` says
when the model's vocabulary is far larger than the ids the data can hold (a GPT-2 sized
embedding for byte tokens: most rows never train). ``size_text`` is the one way sizes are
written. Stdlib only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from speedtronic.config import SpeedtronicConfig

BYTE_VOCAB = 256
VOCAB_SLACK = 4  # a model vocabulary this many times the data's is worth a warning


def size_text(size: float | None) -> str:
    """Bytes as people read them: B, KB, MB or GB; ``-`` when unknown."""
    if size is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"


def file_text(path: str, *notes: str) -> str:
    """``corpus.txt (1.2 MB, byte tokens)``, or what is wrong with it (``missing``, ...)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return f"{path} (missing)"
    except OSError as exc:
        return f"{path} (cannot be read: {exc.strerror or exc})"
    if Path(path).is_dir():
        return f"{path} ({folder_text(path)})"
    return f"{path} ({', '.join([size_text(info.st_size), *notes])})"


def folder_text(path: str) -> str:
    """A token folder in words, from its manifest (the sha256s are checked at start):
    ``folder: 126,516 uint16 tokens in 2 shard(s), 247.1 KB, tokenizer bpe.json (vocab 300)``."""
    from speedtronic.data import manifest
    from speedtronic.errors import DataError

    try:
        found = manifest.summary(manifest.read_manifest(path, "data"))
    except DataError:
        return f"a folder that is not a finished tokenize: no valid {manifest.MANIFEST}"
    tokenizer = found["tokenizer"]
    named = "byte tokens" if tokenizer["kind"] == "byte" else f"tokenizer {tokenizer['source']}"
    return (
        f"folder: {found['tokens']:,} {found['dtype']} tokens in {found['shards']} shard(s), "
        f"{size_text(found['bytes'])}, {named} (vocab {tokenizer['vocab_size']})"
    )


def source_line(config: SpeedtronicConfig, blocks: int | None = None) -> str:
    """``text my_corpus.txt (1.2 MB, byte tokens); eval: the file's last 5%``, in one line."""
    data, source = config.data, config.data.resolved_source
    if source == "synthetic":
        vocab = model_vocab(config) or BYTE_VOCAB
        return f"synthetic (learnable token sequences, no file; vocab {vocab:,})"
    if source == "tokens" and Path(data.token_path).is_dir():
        line = f"tokens {file_text(data.token_path)}"
    elif source == "tokens":
        line = f"tokens {file_text(data.token_path, f'{data.token_dtype} ids')}"
    else:
        tokens = "byte tokens" if data.tokenizer == "byte" else f"tokenizer {data.tokenizer}"
        line = f"text {file_text(data.text_path, tokens)}"
    if blocks is not None:
        line += f"; {blocks:,} training blocks of {config.seq_len} tokens"
    if data.eval_path:
        line += f"; eval: {file_text(data.eval_path)}"
    elif data.eval_fraction:
        line += f"; eval: the file's last {data.eval_fraction:.0%}"
    return line


def blocks_of(dataset: Any) -> int | None:
    """The training blocks of a map-style dataset; None for a stream (its length is unknown)."""
    try:
        return len(dataset)
    except TypeError:
        return None


def data_vocab(config: SpeedtronicConfig) -> int | None:
    """How many ids the data can hold, where that is known without reading it."""
    source = config.data.resolved_source
    if source == "text" and config.data.tokenizer == "byte":
        return BYTE_VOCAB
    return None  # synthetic draws from the model's vocabulary; token files say nothing cheap


def model_vocab(config: SpeedtronicConfig) -> int | None:
    """The configured model vocabulary; the reference model's default when not set."""
    vocab = config.model.params.get("vocab_size")
    if vocab is None and config.model.name == "reference_transformer":
        vocab = BYTE_VOCAB
    return vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None


def vocab_warning(config: SpeedtronicConfig) -> str | None:
    """One line when ``model.vocab_size`` is far above the ids the data can hold."""
    model, data = model_vocab(config), data_vocab(config)
    if model is None or data is None or model < VOCAB_SLACK * data:
        return None
    return (
        f"model.vocab_size: {model:,}, but {config.data.tokenizer} tokens of the text use "
        f"{data} ids; the other {model - data:,} embedding rows never train (they cost memory "
        f"and time): set model.vocab_size: {data}"
    )

"""Named held-out sets (``eval.sets``): each read once at the start of a run into the scorer's
windows, with the bytes its scored tokens came from.

An entry is ``NAME=PATH``. PATH is read by its kind:

- a folder ``speedtronic data tokenize`` wrote: its ``val`` part's first tokens; the bytes are
  those of the text the tokens decode to (with the folder's own tokenizer, which must be the
  run's: ``checkpoint.tokenizer.same_tokenizer``, by identity, not bytes);
- a ``.jsonl`` / ``.jsonl.gz`` / ``.jsonl.zst`` / ``.parquet`` corpus, through the ingest readers
  (its ``text`` field or column), documents joined by a newline;
- anything else: a UTF-8 text file.

Text is read up to ``BYTES_PER_TOKEN`` x ``max_tokens`` bytes (no tokenizer spends more per
token), tokenized with the run's tokenizer, and cut to its first ``max_tokens + 1`` tokens: the
first is context only, as in ``text``'s windowing rule (non-overlapping windows of the model's
length). Bits per byte = nats / ln 2 / bytes, the bytes being the UTF-8 bytes of the scored
tokens' text: ``decode(first max_tokens + 1) - decode(first)``, the source text itself for a
byte-level tokenizer or a byte-level BPE.
"""

from __future__ import annotations

import codecs
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedtronic.errors import DataError
from speedtronic.evaluate.scorer import Request
from speedtronic.evaluate.text import first_token_bytes, windows

BYTES_PER_TOKEN = 16
PIECE_BYTES = 1 << 20
CORPUS_FORMATS = ("jsonl", "jsonl.gz", "jsonl.zst", "parquet")


@dataclass
class HeldOutSet:
    name: str
    source: str
    requests: list[Request]
    tokens: int  # tokens scored
    bytes: int  # the UTF-8 bytes those tokens came from


def parse_entry(entry: str) -> tuple[str, str]:
    name, _, path = entry.partition("=")
    return name, path


def load_set(entry: str, tokenizer: Any, window: int, max_tokens: int) -> HeldOutSet:
    """One ``eval.sets`` entry, read and windowed; a DataError naming it when it cannot be."""
    name, path = parse_entry(entry)
    key = f"eval.sets[{name}]"
    if Path(path).is_dir():
        ids, folders = _folder_tokens(path, key, max_tokens + 1)
        _check_same_tokenizer(key, path, folders, tokenizer)
        tokenizer = folders
    else:
        ids = list(tokenizer(_read_text(path, key, BYTES_PER_TOKEN * max_tokens)))[: max_tokens + 1]
    if len(ids) < 2:
        raise DataError(f"{key}: {path} holds {len(ids)} token(s); a held-out set needs >= 2")
    nbytes = _text_bytes(tokenizer, ids) - first_token_bytes(tokenizer, ids)
    return HeldOutSet(name, path, windows(ids, window), len(ids) - 1, max(nbytes, 1))


def _check_same_tokenizer(key: str, path: str, folders: Any, runs: Any) -> None:
    """A folder tokenized with another tokenizer than the run's gives the model ids that mean
    other tokens to it: refused (a run whose tokenizer is unknown cannot be compared)."""
    from speedtronic.checkpoint.tokenizer import describe, same_tokenizer, tokenizer_record

    theirs, ours = tokenizer_record(folders)[0], tokenizer_record(runs)[0]
    if theirs is not None and ours is not None and not same_tokenizer(theirs, ours):
        raise DataError(
            f"{key}: {path} is tokenized with {describe(theirs)}, but the run with "
            f"{describe(ours)}: the model would read other tokens than the text's",
            hint="tokenize it with the run's tokenizer, or name its text file instead",
        )


def _text_bytes(tokenizer: Any, ids: list[int]) -> int:
    if getattr(tokenizer, "name", None) == "byte":
        return len(ids)
    return len(tokenizer.decode(ids).encode("utf-8"))


def _read_text(path: str, key: str, limit: int) -> str:
    from speedtronic.data.ingest.spec import file_format

    fmt = file_format(path)
    if fmt in CORPUS_FORMATS:
        return _corpus_text(path, fmt, limit)
    data = _head(path, key, limit)
    try:  # final=False: a character cut at the limit is left out, not an error
        return codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
    except UnicodeDecodeError as exc:
        raise DataError(f"{key}: {path} is not UTF-8 text (byte {exc.start})") from None


def _head(path: str, key: str, limit: int) -> bytearray:
    """The first ``limit`` bytes of a regular file, read in pieces: ``read(limit)`` would
    allocate ``limit`` bytes at once (32 GiB for ``max_tokens: 2**31``) however short the file.
    O_NONBLOCK: a FIFO with no writer is refused below rather than waited on."""
    data = bytearray()
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise DataError(f"{key}: {path} must be a regular file (got a FIFO or device)")
            while len(data) < limit and (piece := handle.read(min(PIECE_BYTES, limit - len(data)))):
                data += piece
    except OSError as exc:
        raise DataError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None
    return data


def _corpus_text(path: str, fmt: str, limit: int) -> str:
    from speedtronic.data.ingest.formats import Reader, units

    reader, docs, size = Reader("text"), [], 0
    for unit in units(fmt, path, path, 0, "text"):
        for doc in reader.documents(unit, fmt, path, path)[0]:
            docs.append(doc)
            size += len(doc.encode("utf-8")) + 1
            if size >= limit:
                return "\n".join(docs)
    return "\n".join(docs)


def _folder_tokens(path: str, key: str, count: int) -> tuple[list[int], Any]:
    from speedtronic.data import manifest as manifests
    from speedtronic.data.shards import open_token_path

    doc = manifests.read_manifest(path, key)
    blocks = open_token_path(path, 1, "auto", None, key, part="val")
    ids = blocks.tokens(0, min(count, blocks.starts[-1])).tolist()
    return ids, manifests.tokenizer_of(path, doc)


def load_sets(config: Any, tokenizer: Any) -> list[HeldOutSet]:
    """Every ``eval.sets`` entry of ``config``, read with the run's ``tokenizer``, before the
    run touches its output directory (a typo in a path loses nothing)."""
    if not config.eval.sets:
        return []
    if tokenizer is None:
        raise DataError(
            "eval.sets: bits per byte needs the run's tokenizer, and this run has none "
            "(synthetic data, or a flat token file that names none)",
            hint="train on a text file or a data tokenize folder",
        )
    vocab = config.model.params.get("vocab_size")
    sets = [
        load_set(e, tokenizer, config.seq_len, config.eval.max_tokens) for e in config.eval.sets
    ]
    for held in sets:
        top = max(max(r.continuation) for r in held.requests)
        if isinstance(vocab, int) and top >= vocab:
            raise DataError(
                f"eval.sets[{held.name}]: token id {top} is outside model.vocab_size ({vocab}): "
                "the set was tokenized with another tokenizer"
            )
    return sets

"""Corpora for the ingest tests: a BPE tokenizer trained here, and FineWeb-shaped Parquet shards.

GPT-2's ``tokenizer.json`` cannot be downloaded here (no internet), so ``train_bpe`` trains a
small byte-level BPE with the ``tokenizers`` library on the Python standard library's sources,
with GPT-2's pre-tokenizer, decoder and ``<|endoftext|>`` special token: the same kind of file,
a smaller vocabulary. ``fineweb_rows`` makes rows with FineWeb-Edu's ten columns (``text`` among
them); ``write_parquet`` writes them as FineWeb's shards are written (row groups of ~1,000 rows
in the real ones; a size of one's own here).
"""

from __future__ import annotations

import io
import json
import os
import random
import sys
import sysconfig
from pathlib import Path

FINEWEB_COLUMNS = (
    "text",
    "id",
    "dump",
    "url",
    "file_path",
    "language",
    "language_score",
    "token_count",
    "score",
    "int_score",
)
WORDS = (
    "the model learns from text that people wrote about science history and the ways of "
    "making things work better with care patience and numbers such as 42 or 3.14"
).split()


def stdlib_text(limit_bytes: int = 1 << 20) -> str:
    """Python sources from the standard library, concatenated up to ``limit_bytes``."""
    out, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        out.append(text)
        size += len(text)
        if size >= limit_bytes:
            break
    return "".join(out)


def train_bpe(path: Path, vocab_size: int = 1000, corpus_bytes: int = 1 << 20) -> Path:
    """A GPT-2-style byte-level BPE ``tokenizer.json`` with ``<|endoftext|>``, at ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = stdlib_text(corpus_bytes)
    tok.train_from_iterator([text[i : i + 4096] for i in range(0, len(text), 4096)], trainer)
    tok.save(str(path))
    return path


def documents(n: int, seed: int = 0) -> list[str]:
    """``n`` documents of varied length (some with non-ASCII text), reproducible from ``seed``."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 120))]
        if i % 7 == 0:
            words.append("café — naïve ünïcode 東京")
        docs.append(f"Document {i}. " + " ".join(words) + ".")
    return docs


def fineweb_rows(docs: list[str]) -> dict[str, list]:
    """Columns as in FineWeb-Edu's shards, ``text`` holding ``docs``."""
    n = len(docs)
    return {
        "text": docs,
        "id": [f"<urn:uuid:{i:08x}>" for i in range(n)],
        "dump": ["CC-MAIN-2024-10"] * n,
        "url": [f"https://example.org/{i}" for i in range(n)],
        "file_path": ["s3://commoncrawl/crawl-data/x.warc.gz"] * n,
        "language": ["en"] * n,
        "language_score": [0.97] * n,
        "token_count": [len(d.split()) for d in docs],
        "score": [3.1] * n,
        "int_score": [3] * n,
    }


def parquet_bytes(docs: list[str], row_group_size: int = 100) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table(fineweb_rows(docs)), buf, row_group_size=row_group_size)
    return buf.getvalue()


def write_parquet(path: Path, docs: list[str], row_group_size: int = 100) -> Path:
    path.write_bytes(parquet_bytes(docs, row_group_size))
    return path


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    import gzip

    lines = "".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs))
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.write(lines)
    return path


def expected_tokens(docs: list[str], tokenizer_file: Path | None, separator: int) -> list[int]:
    """What the documented rule gives: the separator, then the document's ids, for each one."""
    out: list[int] = []
    if tokenizer_file is None:
        for d in docs:
            out += [separator, *d.encode("utf-8")]
        return out
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    for d in docs:
        out += [separator, *tok.encode(d, add_special_tokens=False).ids]
    return out


def cut_result_and_die() -> None:
    """A pool task that dies the way a worker killed while it sends a result does: half a
    message in the executor's result pipe (a header promising 1 MB, then 100 bytes), then
    SIGKILL. The pipe is the ``result_queue`` of CPython's worker loop, a few frames up."""
    import signal
    import struct

    frame = sys._getframe()
    while "result_queue" not in frame.f_locals:
        frame = frame.f_back
    writer = frame.f_locals["result_queue"]._writer
    os.write(writer.fileno(), struct.pack("!i", 1_000_000) + b"x" * 100)
    os.kill(os.getpid(), signal.SIGKILL)

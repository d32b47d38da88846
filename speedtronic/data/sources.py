"""Real-data sources: UTF-8 text files and pre-tokenized token files, read without loading them.

Every source yields ``{"input_ids": (T,), "labels": (T,)}`` blocks of ``T + 1`` consecutive
tokens (block ``k`` starts at token ``k * T``, so neighbouring blocks share one token and no
token is wasted).

- ``ByteTextBlocks``: byte-level text, random access with ``os.pread`` (RSS stays flat for any
  file size). Map-style, so the sampler shuffles, shards workers and resumes exactly.
- ``TokenFileBlocks``: flat ``uint16``/``uint32`` token files (nanoGPT layout), memory-mapped,
  map-style like the above.
- ``TokenizedTextStream``: text with any other tokenizer. The file is cut into segments only
  after a newline followed by an ASCII non-space character, where pre-tokenizers split anyway,
  so per-segment tokenization equals whole-text tokenization. Worker ``w`` of ``W`` reads only
  segments ``s % W == w``; each segment yields ``(len - 1) // T`` blocks (its tail is dropped),
  so the set of blocks does not depend on the number of workers. A seeded shuffle buffer
  mixes blocks. It resumes by replay (exact, not instant): pre-tokenize big corpora with
  ``tokenize_file`` for instant resume.

Invalid UTF-8 is an error naming the file and byte offset, not silently replaced: a corpus
with stray Latin-1 bytes should be converted (``iconv -f latin1 -t utf-8``) knowingly.
"""

from __future__ import annotations

import codecs
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from speedtronic.errors import DataError

SEGMENT_BYTES = 1 << 20
_SCAN_BYTES = 1 << 16  # how far past a nominal segment start to look for a safe split
_TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


def _block(tokens: np.ndarray | list[int]) -> dict[str, torch.Tensor]:
    sequence = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
    return {"input_ids": sequence[:-1], "labels": sequence[1:]}


def _check_file(path: Path, key: str) -> int:
    try:
        size = path.stat().st_size
        with path.open("rb"):
            pass
    except FileNotFoundError:
        raise DataError(f"{key}: file not found: {path}") from None
    except OSError as exc:
        raise DataError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None
    if path.is_dir():
        raise DataError(f"{key}: {path} is a directory, not a file")
    if size == 0:
        raise DataError(f"{key}: {path} is empty")
    return size


def _too_short(key: str, path: Path, what: str, seq_len: int) -> DataError:
    return DataError(
        f"{key}: {path} holds {what}, fewer than one block of seq_len + 1 = {seq_len + 1} "
        "tokens; use a longer file or a smaller data.seq_len"
    )


class _BlockRange(Dataset):
    """A map-style window ``[start, end)`` over a source's blocks (train/eval splits)."""

    def __init__(self, num_blocks: int, start: int = 0, end: int | None = None):
        self.start, self.end = start, num_blocks if end is None else end

    def __len__(self) -> int:
        return self.end - self.start

    def split(self, eval_blocks: int) -> tuple[_BlockRange, _BlockRange]:
        """The last ``eval_blocks`` blocks held out: a fixed rule, the same on every run."""
        cut = self.end - eval_blocks
        train, held_out = _copy(self), _copy(self)
        train.end, held_out.start = cut, cut
        return train, held_out


def _copy(obj: Any) -> Any:
    clone = object.__new__(type(obj))
    clone.__dict__.update(obj.__dict__)
    return clone


class ByteTextBlocks(_BlockRange):
    """Byte-level blocks of a UTF-8 text file, random access, validated as they are read."""

    def __init__(self, path: str | Path, seq_len: int, key: str = "data.text_path"):
        self.path, self.seq_len, self.key = Path(path), seq_len, key
        size = _check_file(self.path, key)
        if size < seq_len + 1:
            raise _too_short(key, self.path, f"{size} bytes", seq_len)
        super().__init__((size - 1) // seq_len)
        self._fd: int | None = None
        self._pid: int | None = None

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        offset = (self.start + index) * self.seq_len
        data = os.pread(self._handle(), self.seq_len + 1, offset)
        _check_utf8_window(data, offset, self.path, self.key)
        return _block(np.frombuffer(data, dtype=np.uint8))

    def _handle(self) -> int:
        if self._fd is None or self._pid != os.getpid():  # a forked worker opens its own
            self._fd, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
        return self._fd

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fd": None, "_pid": None}


def _check_utf8_window(data: bytes, offset: int, path: Path, key: str) -> None:
    """Validate bytes that may start or end inside a character (the neighbours check those)."""
    skip = 0
    while skip < min(3, len(data)) and 0x80 <= data[skip] < 0xC0:
        skip += 1
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data[skip:], final=False)
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{key}: {path} is not valid UTF-8 at byte {offset + skip + exc.start}; "
            "convert it first (e.g. iconv -f latin1 -t utf-8)"
        ) from None


class TokenFileBlocks(_BlockRange):
    """Blocks of a flat token file, memory-mapped; every id is checked against the vocab once."""

    def __init__(
        self,
        path: str | Path,
        seq_len: int,
        dtype: str,
        vocab_size: int | None,
        key: str = "data.token_path",
    ):
        self.path, self.seq_len, self.key = Path(path), seq_len, key
        self.dtype = np.dtype(_TOKEN_DTYPES[dtype])
        size = _check_file(self.path, key)
        if size % self.dtype.itemsize:
            raise DataError(
                f"{key}: {self.path} is {size} bytes, not a multiple of {self.dtype.itemsize} "
                f"({dtype}); is data.token_dtype right?"
            )
        tokens = size // self.dtype.itemsize
        if tokens < seq_len + 1:
            raise _too_short(key, self.path, f"{tokens} tokens", seq_len)
        self._tokens: np.memmap | None = None
        if vocab_size is not None:
            self._check_ids(vocab_size)
        super().__init__((tokens - 1) // seq_len)

    def _check_ids(self, vocab_size: int) -> None:
        tokens, chunk = self._memmap(), 1 << 24
        for start in range(0, len(tokens), chunk):
            part = tokens[start : start + chunk]
            if part.max() >= vocab_size:
                position = start + int(np.argmax(part >= vocab_size))
                raise DataError(
                    f"{self.key}: {self.path} has token id {int(tokens[position])} at position "
                    f"{position}, but model.vocab_size is {vocab_size}"
                )

    def _memmap(self) -> np.memmap:
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        return self._tokens

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = (self.start + index) * self.seq_len
        return _block(self._memmap()[start : start + self.seq_len + 1])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tokens": None}  # workers map the file themselves


# ---- text with a general tokenizer -------------------------------------------------------


def segment_bounds(path: Path, segment_bytes: int = SEGMENT_BYTES) -> list[int]:
    """Byte offsets that cut ``path`` into segments at safe split points (first is 0, last EOF)."""
    size = path.stat().st_size
    bounds = [0]
    with path.open("rb") as f:
        while bounds[-1] + segment_bytes < size:
            cut = _safe_cut(f, bounds[-1] + segment_bytes, size)
            if cut >= size:
                break
            bounds.append(cut)
    bounds.append(size)
    return bounds


def _safe_cut(f: Any, start: int, size: int) -> int:
    """First offset >= start right after '\\n' and before an ASCII non-space character.

    Falls back to a character boundary when no such point exists within 4 scan windows
    (a file without line breaks); documented as the one place a merge could differ.
    """
    for window in range(4):
        f.seek(start + window * _SCAN_BYTES - 1)
        data = f.read(_SCAN_BYTES + 1)
        for i in range(len(data) - 1):
            if data[i] == 0x0A and data[i + 1] < 0x80 and not chr(data[i + 1]).isspace():
                return start + window * _SCAN_BYTES + i
        if len(data) <= _SCAN_BYTES:
            return size
    f.seek(start)
    data = f.read(4)
    return start + next((i for i, b in enumerate(data) if not 0x80 <= b < 0xC0), 0)


class TokenizedTextStream(IterableDataset):
    """Text tokenized segment by segment; workers split the segments; seeded shuffle buffer."""

    def __init__(
        self,
        path: str | Path,
        seq_len: int,
        tokenizer: Callable[[str], list[int]],
        seed: int = 0,
        shuffle_buffer: int = 0,
        segment_bytes: int | None = None,
        key: str = "data.text_path",
    ):
        self.path, self.seq_len, self.tokenizer, self.key = Path(path), seq_len, tokenizer, key
        size = _check_file(self.path, key)
        segment_bytes = segment_bytes or min(SEGMENT_BYTES, max(4096, size // 64))
        self.bounds = segment_bounds(self.path, segment_bytes)
        self.segments = list(range(len(self.bounds) - 1))
        self.seed, self.shuffle_buffer, self.epoch = seed, shuffle_buffer, 0

    def split(self, eval_fraction: float) -> tuple[TokenizedTextStream, TokenizedTextStream]:
        """The last segments held out for evaluation (a fixed rule)."""
        held = max(1, round(len(self.segments) * eval_fraction))
        if held >= len(self.segments):
            raise DataError(
                f"{self.key}: {self.path} is too small to hold out "
                f"data.eval_fraction={eval_fraction}; use data.eval_path"
            )
        train, held_out = _copy(self), _copy(self)
        train.segments, held_out.segments = self.segments[:-held], self.segments[-held:]
        held_out.shuffle_buffer = 0
        return train, held_out

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        seed = info.seed if info else self.seed * 1_000_003 + self.epoch
        blocks = self._blocks(self.segments[worker::workers])
        if self.shuffle_buffer > 1:
            blocks = shuffled(blocks, self.shuffle_buffer, random.Random(seed))
        return (_block(b) for b in blocks)

    def _blocks(self, segments: list[int]) -> Iterator[list[int]]:
        T = self.seq_len
        with self.path.open("rb") as f:
            for segment in segments:
                start, end = self.bounds[segment], self.bounds[segment + 1]
                f.seek(start)
                tokens = self.tokenizer(_decode(f.read(end - start), start, self.path, self.key))
                for k in range((len(tokens) - 1) // T):
                    yield tokens[k * T : k * T + T + 1]


def _decode(data: bytes, offset: int, path: Path, key: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{key}: {path} is not valid UTF-8 at byte {offset + exc.start}; "
            "convert it first (e.g. iconv -f latin1 -t utf-8)"
        ) from None


def shuffled(items: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """A seeded shuffle buffer: keeps ``size`` items and emits a random one as each arrives."""
    buffer: list[Any] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        index = rng.randrange(size)
        yield buffer[index]
        buffer[index] = item
    rng.shuffle(buffer)
    yield from buffer


# ---- text -> token file ---------------------------------------------------------------------


def tokenize_file(
    text_path: str | Path,
    out_path: str | Path,
    tokenizer: Callable[[str], list[int]],
    dtype: str = "uint16",
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Write ``text_path`` tokenized as a flat ``dtype`` array to ``out_path``; return the count.

    Streams segment by segment (same safe split points as ``TokenizedTextStream``); the output
    is written to a temporary file and renamed, so a crash never leaves a truncated file.
    ``progress(bytes_done, bytes_total)`` is called after each segment.
    """
    text_path, out_path = Path(text_path), Path(out_path)
    _check_file(text_path, "text file")
    np_dtype, limit = np.dtype(_TOKEN_DTYPES[dtype]), np.iinfo(_TOKEN_DTYPES[dtype]).max
    bounds, count = segment_bounds(text_path), 0
    tmp = out_path.with_name(out_path.name + ".tmp")
    try:
        with text_path.open("rb") as src, tmp.open("wb") as dst:
            for start, end in zip(bounds[:-1], bounds[1:], strict=True):
                ids = np.asarray(
                    tokenizer(_decode(src.read(end - start), start, text_path, "text file"))
                )
                if ids.size and ids.max() > limit:
                    raise DataError(f"token id {int(ids.max())} does not fit {dtype}; use uint32")
                dst.write(ids.astype(np_dtype).tobytes())
                count += int(ids.size)
                if progress:
                    progress(end, bounds[-1])
            dst.flush()
            os.fsync(dst.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out_path)
    return count

"""Real-data sources: UTF-8 text files and pre-tokenized token files, read without loading them.

Every source yields ``{"input_ids": (T,), "labels": (T,)}`` blocks of ``T + 1`` consecutive
tokens (block ``k`` starts at token ``k * T``, so neighbouring blocks share one token and no
token is wasted).

- ``ByteTextBlocks``: byte-level text, random access with ``os.pread`` (RSS stays flat for any
  file size). Map-style, so the sampler shuffles, shards workers and resumes exactly.
- ``TokenFileBlocks``: flat ``uint16``/``uint32`` token files (nanoGPT layout), read with
  ``os.pread`` like the above rather than memory-mapped: a mapped file truncated by another
  process kills the reader with SIGBUS, while a short read is an error that names the file.
- ``TokenizedTextStream``: text with any other tokenizer. The file is cut into segments only
  after a newline followed by an ASCII non-space character, where pre-tokenizers split anyway,
  so per-segment tokenization equals whole-text tokenization. Worker ``w`` of ``W`` reads only
  segments ``s % W == w`` (under DDP: shard ``rank * W + w`` of ``world * W``); each segment
  yields ``(len - 1) // T`` blocks (its tail is dropped), so the set of blocks does not depend
  on the number of workers. A seeded shuffle buffer
  mixes blocks. It resumes by replay (exact, not instant): pre-tokenize big corpora with
  ``tokenize_file`` for instant resume.

Invalid UTF-8 is an error naming the file and byte offset, not silently replaced: a corpus
with stray Latin-1 bytes should be converted (``iconv -f latin1 -t utf-8``) knowingly. Text
sources check the whole file when they are built (``utf8.check_utf8``: the first bad byte,
before the first step); reads check their bytes again, for a file changed under the run.

Only regular files are accepted (a FIFO would block the first read forever, ``/dev/zero``
never ends). A file that shrinks while training (another process truncated or rewrote it)
stops the run with a ``TrainingError`` naming the file as soon as a block falls past its new
end: short blocks would otherwise train on nothing at loss 0.0.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import random
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from speedtronic.data.segments import SEGMENT_BYTES, segment_bounds
from speedtronic.data.utf8 import check_utf8, invalid_utf8
from speedtronic.errors import DataError, TrainingError

__all__ = ["SEGMENT_BYTES", "ByteTextBlocks", "TokenFileBlocks", "TokenizedTextStream"]
__all__ += ["segment_bounds", "shuffled", "tokenize_file"]

_TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


def _block(tokens: np.ndarray | list[int]) -> dict[str, torch.Tensor]:
    sequence = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
    return {"input_ids": sequence[:-1], "labels": sequence[1:]}


def _check_file(path: Path, key: str) -> int:
    """The size of ``path``, refused unless it is a readable, non-empty regular file."""
    try:
        # stat before open: opening a FIFO waits for a writer, and some devices act on open
        _require_regular(path.stat(), path, key)
        fd, info = _open_checked(path)
        os.close(fd)
    except FileNotFoundError:
        raise DataError(f"{key}: file not found: {path}") from None
    except OSError as exc:
        raise DataError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None
    _require_regular(info, path, key)  # again: it may have been replaced in between
    if info.st_size == 0:
        raise DataError(f"{key}: {path} is empty")
    return info.st_size


_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # not on Windows, which has no FIFOs to open anyway


def _open_checked(path: Path) -> tuple[int, os.stat_result]:
    """Open without blocking (even if ``path`` became a FIFO) and stat what was opened."""
    fd = os.open(path, os.O_RDONLY | _NONBLOCK)
    try:
        return fd, os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


def _require_regular(info: os.stat_result, path: Path, key: str) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise DataError(f"{key}: {path} is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise DataError(
            f"{key}: {path} is a {_file_kind(info.st_mode)}, not a regular file; reading it "
            "could block or never end, so copy the data into a file first"
        )


def _file_kind(mode: int) -> str:
    kinds = [
        (stat.S_ISFIFO, "named pipe (FIFO)"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ]
    return next((name for test, name in kinds if test(mode)), "special file")


def _read_exact(fd: int, count: int, offset: int, path: Path, key: str) -> bytes:
    """``count`` bytes at ``offset``, or a one-line error if the file no longer holds them."""
    data = os.pread(fd, count, offset)
    if len(data) < count:
        raise _shrunk(fd, path, key, offset + count)
    return data


def _shrunk(fd: int, path: Path, key: str, needed: int) -> TrainingError:
    # Exit 1, not a DataError (exit 2): the config was fine, the file changed under the run.
    # The run stops before this step updates the weights, so the last checkpoint stays good.
    size = os.fstat(fd).st_size
    return TrainingError(
        f"{key}: {path} shrank to {size} bytes while training, but the next block needs "
        f"{needed} bytes; another process truncated or rewrote it (restore it and resume)"
    )


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
        check_utf8(self.path, key)  # the whole file now, not block by block mid-run
        super().__init__((size - 1) // seq_len)
        self._file = _ProcessFile(self.path, key)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        offset = (self.start + index) * self.seq_len
        data = _read_exact(self._file.fd(), self.seq_len + 1, offset, self.path, self.key)
        _check_utf8_window(data, offset, self.path, self.key)
        return _block(np.frombuffer(data, dtype=np.uint8))


class _ProcessFile:
    """A read descriptor opened lazily in each process; closed with the last source using it."""

    def __init__(self, path: Path, key: str):
        self.path, self.key = path, key
        self._fd: int | None = None
        self._pid: int | None = None

    def fd(self) -> int:
        if self._fd is None or self._pid != os.getpid():  # a forked worker opens its own
            self.close()
            self._fd, self._pid = _reopen(self.path, self.key), os.getpid()
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fd": None, "_pid": None}  # spawned workers open their own

    def __del__(self) -> None:
        self.close()


def _reopen(path: Path, key: str) -> int:
    """A descriptor for a file checked at start; something else in its place is a run error."""
    try:
        fd, info = _open_checked(path)
    except OSError as exc:
        raise TrainingError(f"{key}: cannot reopen {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise TrainingError(f"{key}: {path} was replaced by a {_file_kind(info.st_mode)}")
    return fd


def _check_utf8_window(data: bytes, offset: int, path: Path, key: str) -> None:
    """Validate bytes that may start or end inside a character (the neighbours check those)."""
    skip = 0
    while skip < min(3, len(data)) and 0x80 <= data[skip] < 0xC0:
        skip += 1
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data[skip:], final=False)
    except UnicodeDecodeError as exc:
        raise invalid_utf8(key, path, offset + skip + exc.start) from None


class TokenFileBlocks(_BlockRange):
    """Blocks of a flat token file, random access; every id is checked against the vocab once."""

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
        self._file = _ProcessFile(self.path, key)
        if vocab_size is not None:
            self._check_ids(vocab_size, tokens)
        super().__init__((tokens - 1) // seq_len)

    def _check_ids(self, vocab_size: int, count: int) -> None:
        chunk = 1 << 24  # tokens per read: bounded memory for any file size
        for start in range(0, count, chunk):
            part = self._tokens(start, min(chunk, count - start))
            if part.max() >= vocab_size:
                position = start + int(np.argmax(part >= vocab_size))
                raise DataError(
                    f"{self.key}: {self.path} has token id {int(part[position - start])} at "
                    f"position {position}, but model.vocab_size is {vocab_size}"
                )

    def _tokens(self, start: int, count: int) -> np.ndarray:
        size = self.dtype.itemsize
        data = _read_exact(self._file.fd(), count * size, start * size, self.path, self.key)
        return np.frombuffer(data, dtype=self.dtype)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        return _block(self._tokens((self.start + index) * self.seq_len, self.seq_len + 1))


# ---- text with a general tokenizer -------------------------------------------------------


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
        check_utf8(self.path, key)
        segment_bytes = segment_bytes or min(SEGMENT_BYTES, max(4096, size // 64))
        self.bounds = segment_bounds(self.path, segment_bytes)
        self.segments = list(range(len(self.bounds) - 1))
        self.seed, self.shuffle_buffer, self.epoch = seed, shuffle_buffer, 0
        self.rank, self.world = 0, 1  # DDP: this rank reads only its own segments

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

    def bytes_per_token(self, tokens: int) -> float | None:
        """UTF-8 bytes per token of this stream's first segments, as many as hold ``tokens``
        tokens (what an evaluation reads): turns its loss into bits per byte (issue 53)."""
        nbytes = count = 0
        fd = _reopen(self.path, self.key)
        try:
            for segment in self.segments:
                start, end = self.bounds[segment], self.bounds[segment + 1]
                data = _read_exact(fd, end - start, start, self.path, self.key)
                count += len(self.tokenizer(_decode(data, start, self.path, self.key)))
                nbytes += end - start
                if count >= tokens:
                    break
        finally:
            os.close(fd)
        return nbytes / count if count else None

    def set_shard(self, rank: int, world: int) -> None:
        if len(self.segments) < world:  # a rank with no segment would read nothing at all
            raise DataError(
                f"{self.key}: {len(self.segments)} segment(s) of text for {world} ranks; "
                "a file of a few KB is one segment: use more text, or fewer ranks"
            )
        self.rank, self.world = rank, world

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        seed = info.seed if info else self.seed * 1_000_003 + self.epoch
        shard, shards = self.rank * workers + worker, self.world * workers
        blocks = self._blocks(self.segments[shard::shards])
        if self.shuffle_buffer > 1:
            blocks = shuffled(blocks, self.shuffle_buffer, random.Random(seed))
        return (_block(b) for b in blocks)

    def _blocks(self, segments: list[int]) -> Iterator[list[int]]:
        T = self.seq_len
        fd = _reopen(self.path, self.key)
        try:
            for segment in segments:
                start, end = self.bounds[segment], self.bounds[segment + 1]
                # Whole segments or an error: a truncated one would decode (or fail to) as
                # something else, and a missing one would silently drop its blocks.
                data = _read_exact(fd, end - start, start, self.path, self.key)
                tokens = self.tokenizer(_decode(data, start, self.path, self.key))
                for k in range((len(tokens) - 1) // T):
                    yield tokens[k * T : k * T + T + 1]
        finally:
            os.close(fd)


def _decode(data: bytes, offset: int, path: Path, key: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid_utf8(key, path, offset + exc.start) from None


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
    if out_path.exists() and not out_path.is_file():
        # the rename below would replace it: a directory fails, but a device such as
        # /dev/null would become a regular file (and, run as root, be gone for everyone)
        raise DataError(f"{out_path} exists and is not a regular file; name a new file")
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

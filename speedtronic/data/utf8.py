"""The start-up UTF-8 check of a text file: the whole file, streamed, before the first step.

Blocks are read in a shuffled order, so a check made only as blocks are read finds a bad byte
late in a run (after 50 steps in issue 31) and names whichever bad byte its block held, not the
first. ``check_utf8`` reads the file once from the start, in chunks (memory stays bounded for
any size), and names the offset of the FIRST invalid byte. ASCII chunks, the common case, are
recognised without decoding (``bytes.isascii``); the rest go through an incremental decoder,
so a character split across two chunks is read whole. Measured in docs/benchmarks.md
("Start-up checks of a text file"). Stdlib only.
"""

from __future__ import annotations

import codecs
from pathlib import Path

from speedtronic.errors import DataError

CHUNK_BYTES = 8 << 20  # bounded memory; large enough that the per-chunk cost vanishes


def check_utf8(path: str | Path, key: str, chunk_bytes: int = CHUNK_BYTES) -> None:
    """Raise a DataError naming ``key``, ``path`` and the first invalid byte's offset."""
    path = Path(path)
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0  # of the chunk being read
    with path.open("rb") as f:
        while chunk := f.read(chunk_bytes):
            pending = decoder.getstate()[0]  # bytes of a character cut by the last chunk
            if not pending and chunk.isascii():
                offset += len(chunk)
                continue
            try:
                decoder.decode(chunk, final=False)
            except UnicodeDecodeError as exc:  # positions count from the pending bytes
                raise invalid_utf8(key, path, offset - len(pending) + exc.start) from None
            offset += len(chunk)
        pending = decoder.getstate()[0]
        try:
            decoder.decode(b"", final=True)  # a file that ends inside a character
        except UnicodeDecodeError as exc:
            raise invalid_utf8(key, path, offset - len(pending) + exc.start) from None


def invalid_utf8(key: str, path: Path, offset: int) -> DataError:
    """The one wording of a bad byte, wherever it is found."""
    return DataError(
        f"{key}: {path} is not valid UTF-8 at byte {offset}; "
        "convert it first (e.g. iconv -f latin1 -t utf-8)"
    )

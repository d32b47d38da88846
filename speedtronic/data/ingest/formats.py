"""One reader per format: how a file is cut into units, and how a unit becomes documents.

A unit is the tokenize pipeline's piece of work, fixed by the file alone (never by the number
of workers), so a resumed or differently parallel run cuts the same units and writes the same
bytes:

- **text** (``.txt``): the whole file is one document, cut into ~1 MiB segments at the safe
  split points of ``segments.segment_bounds`` (tokenizing the pieces equals the whole);
- **JSON Lines** (``.jsonl``): byte ranges of ~``UNIT_BYTES``, each ending after a newline;
  workers ``pread`` their own range; one JSON object per line, the ``--column`` field its text;
- **compressed JSON Lines** (``.jsonl.gz``, ``.jsonl.zst``): no random access, so the main
  process decompresses (line by line, bounded) and hands workers ~``UNIT_BYTES`` of whole lines;
- **Parquet**: one unit per row group, read by the worker (``arrow.ParquetText``).

Bad input is one ``DataError`` line naming the file: invalid UTF-8 with its byte offset (of the
decompressed text for ``.gz`` / ``.zst``), a line that is not JSON or not an object, a missing
field (listing the fields there), a missing or non-text column. Blank lines and null values are
skipped and counted, not errors.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from speedtronic.data.segments import segment_bounds
from speedtronic.errors import DataError

UNIT_BYTES = 4 << 20  # bytes of JSON Lines per unit: big enough to amortise, small to keep order
ICONV = "convert it first (e.g. iconv -f latin1 -t utf-8)"


@dataclass(frozen=True)
class Unit:
    """A piece of file ``file``: bytes ``[start, end)`` (of the decompressed stream for
    ``payload`` units), or row group ``start`` of a Parquet file. ``input_bytes`` is its share of
    the file on disk (progress); ``first`` marks a text file's first segment."""

    file: int
    index: int
    start: int
    end: int
    input_bytes: int
    payload: bytes | None = None
    first: bool = False


def units(fmt: str, path: str, name: str, file: int, column: str) -> Iterator[Unit]:
    """The units of one local file, in order (checks a Parquet file's column at once)."""
    if fmt == "parquet":
        from speedtronic.data.ingest.arrow import ParquetText

        table = ParquetText(path, column, name)
        for g in range(table.num_row_groups):
            yield Unit(file, g, g, g + 1, table.stored_bytes(g))
        return
    if fmt in ("jsonl.gz", "jsonl.zst"):
        yield from _stream_units(fmt, path, name, file)
        return
    bounds = segment_bounds(Path(path)) if fmt == "text" else line_bounds(path, UNIT_BYTES)
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        yield Unit(file, i, start, end, end - start, first=fmt == "text" and i == 0)


def line_bounds(path: str, unit_bytes: int) -> list[int]:
    """Offsets cutting ``path`` into ranges of about ``unit_bytes``, each after a newline."""
    size = os.path.getsize(path)
    bounds = [0]
    with open(path, "rb") as f:
        while bounds[-1] + unit_bytes < size:
            f.seek(bounds[-1] + unit_bytes)
            f.readline()  # to the end of the line the nominal cut falls in
            if f.tell() >= size:
                break
            bounds.append(f.tell())
    if size:
        bounds.append(size)
    return bounds


def _stream_units(fmt: str, path: str, name: str, file: int) -> Iterator[Unit]:
    if fmt == "jsonl.gz":
        raw = open(path, "rb")  # noqa: SIM115 - closed below, after the stream on it
        stream, errors = gzip.GzipFile(fileobj=raw), (OSError, EOFError, zlib.error)
    else:
        from speedtronic.data.ingest.arrow import stream_errors, zstd_stream

        stream, raw = zstd_stream(path, name)
        errors = stream_errors()
    try:
        offset, seen, index = 0, 0, 0
        while True:
            try:
                chunk = stream.read(UNIT_BYTES)
                if chunk and not chunk.endswith(b"\n"):
                    chunk += stream.readline()  # whole lines only
            except errors as exc:
                kind = "gzip" if fmt == "jsonl.gz" else "zstd"
                raise DataError(
                    f"{name}: damaged {kind} data after {offset} bytes of decompressed text: {exc}"
                ) from None
            if not chunk:
                return
            done = raw.tell()
            yield Unit(file, index, offset, offset + len(chunk), done - seen, payload=chunk)
            offset, seen, index = offset + len(chunk), done, index + 1
    finally:
        raw.close()


# ---- worker side ---------------------------------------------------------------------------


class Reader:
    """Reads units into documents in a worker; keeps the last Parquet file open."""

    def __init__(self, column: str):
        self.column = column
        self._parquet: tuple[str, object] | None = None

    def text(self, unit: Unit, path: str, name: str) -> str:
        """A text file's segment, decoded (invalid UTF-8 names the byte offset)."""
        return decode(read_range(path, unit.start, unit.end, name), unit.start, name)

    def documents(self, unit: Unit, fmt: str, path: str, name: str) -> tuple[list[str], int]:
        """The unit's documents and the number of rows skipped (blank lines, null values)."""
        if fmt == "parquet":
            return self._rows(unit, path, name)
        data = unit.payload
        if data is None:
            data = read_range(path, unit.start, unit.end, name)
        where = " of its decompressed text" if unit.payload is not None else ""
        return json_lines(data, unit.start, self.column, name, where)

    def _rows(self, unit: Unit, path: str, name: str) -> tuple[list[str], int]:
        from speedtronic.data.ingest.arrow import ParquetText

        if self._parquet is None or self._parquet[0] != path:
            self._parquet = (path, ParquetText(path, self.column, name))
        table = self._parquet[1]
        row = sum(table.rows(g) for g in range(unit.start))
        docs, skipped = [], 0
        for batch in table.batches(unit.start):
            for value in batch:
                if isinstance(value, bytes):
                    value = _row_text(value, row, self.column, name)
                if value:
                    docs.append(value)
                else:
                    skipped += 1
                row += 1
        return docs, skipped


def read_range(path: str, start: int, end: int, name: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.pread(fd, end - start, start)
    finally:
        os.close(fd)
    if len(data) != end - start:
        raise DataError(f"{name}: shrank while being read (wanted bytes {start}-{end})")
    return data


def decode(data: bytes, offset: int, name: str, where: str = "") -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{name}: not valid UTF-8 at byte {offset + exc.start}{where}; {ICONV}"
        ) from None


def _row_text(value: bytes, row: int, column: str, name: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{name}: row {row} of column {column!r} is not valid UTF-8 at byte {exc.start}"
        ) from None


def json_lines(
    data: bytes, offset: int, column: str, name: str, where: str = ""
) -> tuple[list[str], int]:
    """The ``column`` field of each JSON object line in ``data`` (which starts at ``offset``)."""
    docs, skipped, pos = [], 0, offset
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # what follows the last newline: no line
    for line in lines:
        here, pos = pos, pos + len(line) + 1
        if not line.strip():
            skipped += 1
            continue
        try:
            obj = json.loads(line)
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{name}: not valid UTF-8 at byte {here + exc.start}{where}; {ICONV}"
            ) from None
        except ValueError as exc:
            raise DataError(
                f"{name}: the line at byte {here}{where} is not JSON ({_json_reason(exc)})"
            ) from None
        docs_or_skip = _field(obj, column, name, f"the line at byte {here}{where}")
        if docs_or_skip is None:
            skipped += 1
        else:
            docs.append(docs_or_skip)
    return docs, skipped


def _field(obj: object, column: str, name: str, where: str) -> str | None:
    if not isinstance(obj, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
            type(obj), "a number"
        )
        raise DataError(f"{name}: {where} is {kind}, not a JSON object")
    if column not in obj:
        there = ", ".join(list(obj)[:12]) or "none"
        raise DataError(
            f"{name}: {where} has no field {column!r} (its fields: {there}); pass --column NAME"
        )
    value = obj[column]
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise DataError(f"{name}: field {column!r} of {where} is {type(value).__name__}, not text")
    return value


def _json_reason(exc: ValueError) -> str:
    msg = getattr(exc, "msg", None)
    return f"{msg} at column {exc.colno}" if msg and hasattr(exc, "colno") else str(exc)

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

With ``--chat`` a row's field (``--messages-key``) is a conversation, a list of ``{role,
content}`` objects (``json_conversations``; a Parquet list column), handed on with where it
lies for the errors its rendering may raise (``chat``).

Bad input is one ``DataError`` line naming the file: invalid UTF-8 with its byte offset (of the
decompressed text for ``.gz`` / ``.zst``), a line that is not JSON or not an object (nested too
deep for the parser included), a lone surrogate escape (``\\ud800``: no UTF-8 for it), a
missing field (listing the fields there), a missing or non-text column. Blank lines and null
values are skipped and counted, not errors.

Memory is bounded whatever the input: a JSON Lines line (or a Parquet value) longer than
``limit`` bytes (``--max-document-bytes``) is refused, naming the file and where; the end of a
line is looked for ``limit`` bytes at most, in the main process (``line_bounds``, the stream
cut) and in the workers, so a newline-free gzip member is never decompressed whole.
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
MAX_DOCUMENT_BYTES = 64 << 20  # the default --max-document-bytes
_SCAN = 1 << 20  # bytes read at a time looking for the end of a line
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


def units(
    fmt: str,
    path: str,
    name: str,
    file: int,
    column: str,
    limit: int = MAX_DOCUMENT_BYTES,
    chat: bool = False,
) -> Iterator[Unit]:
    """The units of one local file, in order (checks a Parquet file's column at once;
    ``chat``: a column of conversations)."""
    if fmt == "parquet":
        from speedtronic.data.ingest.arrow import ParquetText

        table = ParquetText(path, column, name, chat)
        for g in range(table.num_row_groups):
            yield Unit(file, g, g, g + 1, table.stored_bytes(g))
        return
    if fmt in ("jsonl.gz", "jsonl.zst"):
        yield from _stream_units(fmt, path, name, file, limit)
        return
    if fmt == "text":
        bounds = segment_bounds(Path(path))
    else:
        bounds = line_bounds(path, UNIT_BYTES, limit, name)
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        yield Unit(file, i, start, end, end - start, first=fmt == "text" and i == 0)


def line_bounds(
    path: str, unit_bytes: int, limit: int = MAX_DOCUMENT_BYTES, name: str = ""
) -> list[int]:
    """Offsets cutting ``path`` into ranges of about ``unit_bytes``, each after a newline; a
    line found longer than ``limit`` is refused (its end is looked for that far, no further)."""
    size = os.path.getsize(path)
    bounds = [0]
    with open(path, "rb") as f:
        while bounds[-1] + unit_bytes < size:
            cut = _line_end(f, bounds[-1] + unit_bytes, limit, name or path)
            if cut >= size:
                break
            bounds.append(cut)
    if size:
        bounds.append(size)
    return bounds


def _line_end(f, start: int, limit: int, name: str) -> int:
    """The offset just past the first newline at or after ``start`` (EOF if none)."""
    f.seek(start)
    seen = 0
    while block := f.read(min(_SCAN, limit + 1 - seen)):
        found = block.find(b"\n")
        if found >= 0:
            return start + seen + found + 1
        seen += len(block)
        if seen > limit:
            raise too_long(name, f"the line holding byte {start:,}", limit)
    return start + seen


def too_long(name: str, where: str, limit: int) -> DataError:
    return DataError(
        f"{name}: {where} is longer than {limit:,} bytes (--max-document-bytes); split that "
        "document, or raise the limit if this machine has the memory for it"
    )


def _stream_units(fmt: str, path: str, name: str, file: int, limit: int) -> Iterator[Unit]:
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
                    chunk += _rest_of_line(stream, chunk, offset, limit, name)  # whole lines
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


def _rest_of_line(stream, chunk: bytes, offset: int, limit: int, name: str) -> bytes:
    """The rest of ``chunk``'s last line, read ``limit`` bytes at most (a newline-free member
    is not decompressed whole); a longer line is refused."""
    begins = chunk.rfind(b"\n") + 1
    room = limit + 1 - (len(chunk) - begins)
    rest = stream.readline(room) if room > 0 else b""
    if room <= 0 or (len(rest) == room and not rest.endswith(b"\n")):
        where = f"the line at byte {offset + begins:,} of its decompressed text"
        raise too_long(name, where, limit)
    return rest


# ---- worker side ---------------------------------------------------------------------------


class Reader:
    """Reads units into documents in a worker; keeps the last Parquet file open."""

    def __init__(self, column: str, limit: int = MAX_DOCUMENT_BYTES, chat: bool = False):
        self.column, self.limit, self.chat = column, limit, chat
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
        if self.chat:
            return json_conversations(data, unit.start, self.column, name, where, self.limit)
        return json_lines(data, unit.start, self.column, name, where, self.limit)

    def _rows(self, unit: Unit, path: str, name: str) -> tuple[list[str], int]:
        from speedtronic.data.ingest.arrow import ParquetText

        if self._parquet is None or self._parquet[0] != path:
            self._parquet = (path, ParquetText(path, self.column, name, self.chat))
        table = self._parquet[1]
        row = sum(table.rows(g) for g in range(unit.start))
        docs, skipped = [], 0
        for batch in table.batches(unit.start, self.limit):
            for value in batch:
                if self.chat and value is not None:
                    from speedtronic.data.ingest.chat import check_messages

                    docs.append(
                        (
                            f"{name}: row {row}",
                            check_messages(value, f"{name}: row {row}", self.column),
                        )
                    )
                    row += 1
                    continue
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
    data: bytes,
    offset: int,
    column: str,
    name: str,
    where: str = "",
    limit: int = MAX_DOCUMENT_BYTES,
) -> tuple[list[str], int]:
    """The ``column`` field of each JSON object line in ``data`` (which starts at ``offset``)."""
    docs, skipped = [], 0
    for here, line in lines_at(data, offset, name, where, limit):
        if line is None:
            skipped += 1
            continue
        value = _field(
            parse_line(line, here, name, where), column, name, f"the line at byte {here}{where}"
        )
        if value is None:
            skipped += 1
        else:
            docs.append(no_surrogate(value, line, f"{name}: the line at byte {here}{where}"))
    return docs, skipped


def json_conversations(
    data: bytes, offset: int, key: str, name: str, where: str = "", limit: int = MAX_DOCUMENT_BYTES
) -> tuple[list[tuple[str, list]], int]:
    """The conversation (field ``key``) of each JSON object line in ``data``, with where it is
    (``name: the line at byte N``) for the errors that rendering it may raise."""
    from speedtronic.data.ingest.chat import check_messages

    rows, skipped = [], 0
    for here, line in lines_at(data, offset, name, where, limit):
        if line is None:
            skipped += 1
            continue
        obj, at = parse_line(line, here, name, where), f"{name}: the line at byte {here}{where}"
        if not isinstance(obj, dict) or key not in obj:
            there = ", ".join(list(obj)[:12]) if isinstance(obj, dict) else "not a JSON object"
            raise DataError(
                f"{at} has no field {key!r} (its fields: {there or 'none'}); a conversation "
                "is a list of {role, content} messages: pass --messages-key NAME"
            )
        if obj[key] is None:
            skipped += 1
            continue
        rows.append((at, check_messages(obj[key], at, key)))
    return rows, skipped


def lines_at(data: bytes, offset: int, name: str, where: str, limit: int):
    """``(byte offset, line)`` of each line of ``data`` (which starts at ``offset``), the line
    None where it is blank; a line over ``limit`` bytes is refused naming where it starts."""
    pos, lines = offset, data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # what follows the last newline: no line
    for line in lines:
        here, pos = pos, pos + len(line) + 1
        if not line.strip():
            yield here, None
        elif len(line) > limit:
            raise too_long(name, f"the line at byte {here:,}{where}", limit)
        else:
            yield here, line


def parse_line(line: bytes, here: int, name: str, where: str) -> object:
    """One JSON line starting at byte ``here`` of ``name``, or one DataError line saying why not
    (also ``speedtronic eval``'s task reader: one wording for both)."""
    try:
        return json.loads(line)
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{name}: not valid UTF-8 at byte {here + exc.start}{where}; {ICONV}"
        ) from None
    except RecursionError:  # json's C parser recurses once per level: 100,000 '[' are too deep
        raise DataError(
            f"{name}: the line at byte {here}{where} is not JSON a parser can read (nested "
            "too deep); a document is a JSON object with a text field"
        ) from None
    except ValueError as exc:
        raise DataError(
            f"{name}: the line at byte {here}{where} is not JSON ({_json_reason(exc)})"
        ) from None


def no_surrogate(value: str, line: bytes, where: str) -> str:
    """``value``, if it is text UTF-8 can hold: a ``\\ud800`` escape without its pair decodes to
    a lone surrogate, which no tokenizer can encode. Only a line with such an escape is checked
    (the raw bytes are valid UTF-8, so a surrogate can come from an escape alone)."""
    if b"\\ud" not in line and b"\\uD" not in line:
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = f"\\u{ord(value[exc.start]):04x}"
        raise DataError(
            f"{where} holds the escape {bad}, half of a surrogate pair with no other half; "
            "JSON text must encode whole characters (fix or drop that line)"
        ) from None
    return value


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

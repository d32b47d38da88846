"""Parquet (and zstd) through pyarrow: the only module that imports it.

pyarrow is the ``speedtronic[data]`` extra (the dev install has it); without it a Parquet or
``.zst`` source is a one-line error with the install hint. ``ParquetText`` opens a file,
checks that the column exists and holds text (else the error lists the columns there), and
reads one row group at a time, in batches, so memory stays bounded by a batch rather than the
file. Row groups are the tokenize pipeline's units: a worker reads its own, and a resumed
tokenize restarts at the first row group not yet written. A damaged file (bad footer, a page
that does not decode) is a ``DataError`` naming it.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any, BinaryIO

from speedtronic.errors import ConfigError, DataError

BATCH_ROWS = 4096  # rows decoded at a time within a row group
HINT = "pip install 'speedtronic[data]' (or: pip install pyarrow)"


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401 - loads the submodule
    except ImportError:
        raise ConfigError(
            "reading Parquet or .zst files needs the 'pyarrow' package", HINT
        ) from None
    return pyarrow


def available() -> bool:
    try:
        _pyarrow()
    except ConfigError:
        return False
    return True


class ParquetText:
    """One Parquet file's text column: its row groups, read one batch of rows at a time."""

    def __init__(self, path: str, column: str, name: str, chat: bool = False):
        pa = _pyarrow()
        self.chat = chat
        self.name, self.column = name, column
        try:
            self._file = pa.parquet.ParquetFile(path)
            schema = self._file.schema_arrow
        except (pa.ArrowException, OSError) as exc:
            raise DataError(
                f"{name}: not a readable Parquet file (damaged?): {_line(exc)}"
            ) from None
        if column not in schema.names:
            there = ", ".join(schema.names) or "none"
            option = "--messages-key" if chat else "--column"
            raise DataError(
                f"{name}: no column {column!r} (its columns: {there}); pass {option} NAME"
            )
        kind = schema.field(column).type
        if chat and not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
            raise DataError(
                f"{name}: column {column!r} holds {kind}, not a list of messages; pass "
                "--messages-key NAME"
            )
        if not chat and not _textual(pa, kind):
            raise DataError(f"{name}: column {column!r} holds {kind}, not text; pass --column NAME")
        meta = self._file.metadata
        self.row_groups = [meta.row_group(i) for i in range(meta.num_row_groups)]

    @property
    def num_row_groups(self) -> int:
        return len(self.row_groups)

    def rows(self, index: int) -> int:
        return self.row_groups[index].num_rows

    def stored_bytes(self, index: int) -> int:
        """The row group's bytes on disk (compressed): its share of the file, for progress."""
        group = self.row_groups[index]
        return sum(group.column(i).total_compressed_size for i in range(group.num_columns))

    def batches(self, index: int, limit: int | None = None) -> Iterator[list]:
        """Row group ``index``'s column values, ``BATCH_ROWS`` at a time (str, bytes or None);
        a value longer than ``limit`` bytes is refused, naming its row."""
        pa = _pyarrow()
        row = sum(self.rows(g) for g in range(index))
        try:
            reader = self._file.iter_batches(
                batch_size=BATCH_ROWS, row_groups=[index], columns=[self.column]
            )
            for batch in reader:
                values = batch.column(0)
                if pa.types.is_dictionary(values.type):  # text stored once per distinct value
                    values = values.dictionary_decode()
                self._check_lengths(pa, values, row, limit)
                row += len(values)
                yield values.to_pylist()
        except (pa.ArrowException, OSError) as exc:
            raise DataError(
                f"{self.name}: row group {index} cannot be read (damaged?): {_line(exc)}"
            ) from None

    def _check_lengths(self, pa: Any, values: Any, row: int, limit: int | None) -> None:
        if limit is None or not len(values) or self.chat:  # a conversation: its rendering's
            return
        import pyarrow.compute as pc

        lengths = pc.binary_length(values)
        top = pc.max(lengths).as_py()
        if top is not None and top > limit:
            where = row + pc.index(lengths, top).as_py()
            raise DataError(
                f"{self.name}: row {where} of column {self.column!r} is {top:,} bytes, longer "
                f"than {limit:,} (--max-document-bytes); split that document, or raise the limit"
            )


def _textual(pa: Any, kind: Any) -> bool:
    """A string or binary type, or a dictionary of them (Arrow's categorical text)."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    tests = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary)
    tests += (pa.types.is_large_binary, getattr(pa.types, "is_string_view", lambda t: False))
    return any(test(kind) for test in tests)


def zstd_stream(path: str, name: str) -> tuple[BinaryIO, Any]:
    """A buffered file object of ``path``'s zstd-decompressed bytes, and the raw file under it
    (whose ``tell()`` says how much of the compressed file was read)."""
    pa = _pyarrow()
    try:
        raw = pa.OSFile(path, "rb")
        return io.BufferedReader(pa.CompressedInputStream(raw, "zstd")), raw
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{name}: cannot open as zstd: {_line(exc)}") from None


def stream_errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged zstd stream raises."""
    pa = _pyarrow()
    return (pa.ArrowException, OSError)


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__

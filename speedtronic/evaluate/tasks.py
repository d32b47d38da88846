"""Task data adapters: a task file in, multiple-choice items out.

An adapter reads one task's file form and yields ``Item``s (a context, its choices, the index
of the right one); scoring them is ``choice``'s, the same for every task. HellaSwag's JSONL form
is one object per line with ``ctx`` (text), ``endings`` (a list of texts) and ``label`` (an index
into them, an integer or a numeric string as the Hub's copy has it). Each ending is scored as the
continuation ``" " + ending`` after ``ctx``, as nanoGPT and llm.c do. A bad line is one DataError
naming the file, the line and what is wrong, before any scoring; a line is read
``MAX_LINE_BYTES`` at most, so an endless one (``/dev/zero``) is refused, never held whole.

Another multiple-choice task (ARC-easy, PIQA, ...) is one more function here that maps its
records to ``Item``s and one entry in ``ADAPTERS``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from speedtronic.errors import DataError

MAX_LINE_BYTES = 1 << 20  # a task item is a few KB; a longer line is not one


@dataclass(frozen=True)
class Item:
    context: str
    choices: tuple[str, ...]  # each is scored as a continuation of ``context``, as it stands
    label: int
    where: str  # FILE:LINE, for per-example reports


def jsonl_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; anything else is one DataError. A line
    is read ``MAX_LINE_BYTES`` at most: a longer one (or ``/dev/zero``) is refused, not held."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise DataError(f"--data: cannot read {path}: {exc.strerror or exc}") from None
    with handle:
        here, number = 0, 0
        while line := _line(handle, path, number + 1):
            number, here = number + 1, here + len(line)
            if line.strip():
                yield number, _object(f"{path}:{number}", line, here - len(line))


def _line(handle: BinaryIO, path: Path, number: int) -> bytes:
    try:
        line = handle.readline(MAX_LINE_BYTES + 1)
    except OSError as exc:
        raise DataError(f"--data: cannot read {path}: {exc.strerror or exc}") from None
    if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):  # a newline is not content
        raise DataError(
            f"{path}:{number}: the line is longer than {MAX_LINE_BYTES:,} bytes, more than a "
            "task item needs (one JSON object per line)"
        )
    return line


def _object(where: str, line: bytes, here: int) -> dict[str, Any]:
    from speedtronic.data.ingest.formats import no_surrogate, parse_line

    record = parse_line(line, here, where, "")
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for value in record.values():  # the texts an adapter can read: strings, lists of strings
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str):
                no_surrogate(text, line, where)
    return record


def hellaswag_item(record: dict[str, Any], where: str) -> Item:
    """One HellaSwag record as an Item; DataError naming ``where`` and the field otherwise."""
    ctx, endings = record.get("ctx"), record.get("endings")
    if not isinstance(ctx, str) or not ctx:
        got = "got ''" if ctx == "" else _got(record, "ctx")
        raise DataError(f"{where}: field 'ctx' must be a non-empty string ({got})")
    if not (isinstance(endings, list) and len(endings) >= 2):
        raise DataError(f"{where}: field 'endings' must be a list of >= 2 strings")
    if not all(isinstance(e, str) and e for e in endings):
        raise DataError(f"{where}: field 'endings' must hold non-empty strings only")
    label = _label(record.get("label"), len(endings), where)
    return Item(ctx, tuple(" " + e for e in endings), label, where)


def _label(value: Any, count: int, where: str) -> int:
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise DataError(f"{where}: field 'label' must be an integer index (got {value!r})")
    if not 0 <= value < count:
        raise DataError(f"{where}: label {value} is out of range for {count} endings")
    return value


def _got(record: dict[str, Any], key: str) -> str:
    return "missing" if key not in record else f"got {type(record[key]).__name__}"


def read_task(name: str, path: Path, limit: int | None = None) -> list[Item]:
    """The first ``limit`` items (all without) of task ``name``'s file, every one checked."""
    adapter = ADAPTERS.get(name)
    if adapter is None:
        raise DataError(f"--task: unknown task {name!r} (known: {', '.join(sorted(ADAPTERS))})")
    items = []
    for number, record in jsonl_records(path):
        if limit is not None and len(items) >= limit:
            break
        items.append(adapter(record, f"{path}:{number}"))
    if not items:
        raise DataError(f"{path}: no task items in it (one JSON object per line)")
    return items


ADAPTERS: dict[str, Callable[[dict[str, Any], str], Item]] = {"hellaswag": hellaswag_item}

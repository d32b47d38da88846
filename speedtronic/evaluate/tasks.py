"""Task data adapters: a task file in, multiple-choice items out.

An adapter reads one task's file form and yields ``Item``s (a context, its choices, the index
of the right one); scoring them is ``choice``'s, the same for every task. HellaSwag's JSONL form
is one object per line with ``ctx`` (text), ``endings`` (a list of texts) and ``label`` (an index
into them, an integer or a numeric string as the Hub's copy has it). Each ending is scored as the
continuation ``" " + ending`` after ``ctx``, as nanoGPT and llm.c do. A bad line is one DataError
naming the file, the line and what is wrong, before any scoring.

Another multiple-choice task (ARC-easy, PIQA, ...) is one more function here that maps its
records to ``Item``s and one entry in ``ADAPTERS``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedtronic.errors import DataError


@dataclass(frozen=True)
class Item:
    context: str
    choices: tuple[str, ...]  # each is scored as a continuation of ``context``, as it stands
    label: int
    where: str  # FILE:LINE, for per-example reports


def jsonl_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; anything else is one DataError."""
    try:
        handle = path.open("r", encoding="utf-8")
    except OSError as exc:
        raise DataError(f"--data: cannot read {path}: {exc.strerror or exc}") from None
    with handle:
        try:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    yield number, _object(path, number, line)
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: not UTF-8 text ({exc.reason})") from None


def _object(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{number}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(record, dict):
        raise DataError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
    return record


def hellaswag_item(record: dict[str, Any], where: str) -> Item:
    """One HellaSwag record as an Item; DataError naming ``where`` and the field otherwise."""
    ctx, endings = record.get("ctx"), record.get("endings")
    if not isinstance(ctx, str):
        raise DataError(f"{where}: field 'ctx' must be a string ({_got(record, 'ctx')})")
    if not (isinstance(endings, list) and len(endings) >= 2):
        raise DataError(f"{where}: field 'endings' must be a list of >= 2 strings")
    if not all(isinstance(e, str) and e for e in endings):
        raise DataError(f"{where}: field 'endings' must hold non-empty strings only")
    label = _label(record.get("label"), len(endings), where)
    return Item(ctx, tuple(" " + e for e in endings), label, where)


def _label(value: Any, count: int, where: str) -> int:
    if isinstance(value, str) and value.strip().isdigit():
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

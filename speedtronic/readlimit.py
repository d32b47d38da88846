"""The one bounded reader for user files a command reads whole (config.json, tokenizer files,
task files, texts to score).

A file read whole is read with a limit: at most ``limit + 1`` bytes ever come into memory, so a
link to ``/dev/zero``, a FIFO or a 600 MB file is refused in one line naming the file and the
limit, never met with a ``MemoryError`` after minutes. Callers pick the error class (a
``DataError`` for data, a ``ConfigError`` for a model's config) so exit codes stay theirs.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from speedtronic.errors import ConfigError, DataError

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def size_words(n: int) -> str:
    """``n`` bytes in the unit a reader expects: 4 MiB, 64 KiB, 2 GiB."""
    for unit, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} bytes"


def read_bytes(
    path: str | Path, limit: int, what: str = "", error: type[ConfigError] = DataError
) -> bytes:
    """The bytes of ``path``, refused with ``error`` if it is not a regular file or holds more
    than ``limit`` bytes. ``what`` names the file's role in the message ("config.json")."""
    name = f"{what} {path}" if what else str(path)
    try:
        # O_NONBLOCK: opening a FIFO with no writer must not hang; a regular file ignores it
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
            info = os.fstat(handle.fileno())
            if stat.S_ISDIR(info.st_mode):
                raise error(f"{name} is a directory, not a file")
            if not stat.S_ISREG(info.st_mode):
                raise error(f"{name}: must be a regular file (got a FIFO, socket or device)")
            if info.st_size > limit:
                raise error(_too_big(name, limit, info.st_size))
            data = handle.read(limit + 1)
    except IsADirectoryError:
        raise error(f"{name} is a directory, not a file") from None
    except OSError as exc:
        raise error(f"cannot read {name}: {exc.strerror or exc}") from None
    if len(data) > limit:  # grew while we read it
        raise error(_too_big(name, limit, len(data)))
    return data


def read_text(
    path: str | Path, limit: int, what: str = "", error: type[ConfigError] = DataError
) -> str:
    """``read_bytes`` decoded as UTF-8, with the byte offset of the first bad byte on error."""
    data = read_bytes(path, limit, what, error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        name = f"{what} {path}" if what else str(path)
        raise error(f"{name}: not UTF-8 text (byte {exc.start})") from None


def read_json(
    path: str | Path, limit: int, what: str = "", error: type[ConfigError] = DataError
) -> object:
    """``read_text`` parsed as strict JSON: no ``NaN``/``Infinity`` literals, no nesting deeper
    than Python's parser can hold; each refused in one line naming the file."""
    text = read_text(path, limit, what, error)
    name = f"{what} {path}" if what else str(path)
    try:
        return json.loads(text, parse_constant=_no_constant)
    except _NonFinite as exc:
        raise error(
            f"{name}: holds {exc.args[0]}, which is not JSON (numbers must be finite)"
        ) from None
    except RecursionError:
        raise error(f"{name}: nested too deeply to read") from None
    except ValueError as exc:
        raise error(f"{name}: not valid JSON ({exc})") from None


class _NonFinite(ValueError):
    pass


def _no_constant(word: str) -> object:
    raise _NonFinite(word)


def _too_big(name: str, limit: int, size: int) -> str:
    return f"{name}: must be at most {size_words(limit)} (got {size} bytes or more)"

"""Where a UTF-8 text file may be cut so that tokenizing the pieces equals tokenizing the whole.

``segment_bounds`` cuts only right after a newline followed by an ASCII non-space character,
where pre-tokenizers split anyway (GPT-2's and its kin's byte-level rules, whitespace rules),
so per-segment tokenization equals whole-text tokenization. The streamed text source and the
tokenize pipeline both cut here. Stdlib only: tokenize workers load it without torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SEGMENT_BYTES = 1 << 20
_SCAN_BYTES = 1 << 16  # how far past a nominal segment start to look for a safe split


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

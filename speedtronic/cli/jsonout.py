"""The one way a command writes a ``--format json`` document: strict JSON.

Python's ``json.dumps`` writes a NaN or an infinity as the bare words ``NaN`` / ``Infinity``,
which no JSON parser but Python's reads (``jq`` and browsers refuse the whole document). Here a
non-finite number becomes ``null`` (the figure is unknown), and ``allow_nan=False`` makes any
that slips through an error rather than a document nobody can read.
"""

from __future__ import annotations

import json
import math
from typing import Any


def json_text(doc: Any, indent: int | None = 2) -> str:
    """``doc`` as strict JSON (non-finite numbers as null); ``indent=None``: one line."""
    return json.dumps(finite(doc), indent=indent, allow_nan=False)


def finite(value: Any) -> Any:
    """A copy of ``value`` with every non-finite float inside it replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value

"""How config problems are worded: bad values shown briefly, unknown keys with a suggestion.

Every config message names the key path, the rule and the bad value
(``optimizer.lr: must be > 0 (got -0.1)``). This module owns the "bad value" and "suggestion"
parts, kept short and safe to print whatever a user or an attacker put in the file: a
5,000-character string or a 400-digit integer must not turn one error into a screenful.
"""

from __future__ import annotations

import difflib
from typing import Any

MAX_SHOWN = 80  # characters of a value or key shown in a message


def brief(value: Any) -> str:
    """``repr(value)`` cut to a readable length; huge integers by their size only."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        digits = int(value.bit_length() * 0.30103) + 1  # within one of the true count
        if digits > 4000:  # str() past 4,300 digits raises ValueError (and is slow)
            return f"an integer of about {digits} digits"
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value)
    if len(text) <= MAX_SHOWN:
        return text
    return f"{text[: MAX_SHOWN - 20]}... ({len(text)} characters)"


def describe(value: Any) -> str:
    if isinstance(value, str):
        return f"the string {brief(value)}"
    if isinstance(value, (dict, list)):
        return f"a {type(value).__name__}"
    return brief(value)


def key_text(key: Any) -> str:
    """A key as shown in a key path: plain keys as they are, odd ones quoted and cut."""
    if isinstance(key, str) and key.isprintable() and len(key) <= MAX_SHOWN and "." not in key:
        return key
    return brief(key)


def unknown(path: str, key: str, known: list[str]) -> str:
    # difflib is quadratic in the key's length; a long key is no typo of a short one
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6) if len(key) < 200 else []
    hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(known)}"
    return f"{path}: unknown key{hint}"


def summary(problems: list[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems in config: " + "; ".join(problems)

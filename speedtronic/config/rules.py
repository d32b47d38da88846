"""The vocabulary the config sections are written in: ranges beside defaults, and name rules.

``ranged(3e-4, "(0, inf)")`` declares a field's allowed interval next to its default; the
builder applies every range the same way, so a rule is written once and its message never
drifts from it. The name patterns (node ids, Hub user names) are shared by several sections.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

NODE_ID_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # \Z: "abc\n" does not match
HUB_USER_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,94}[A-Za-z0-9])?")
STEPS = "[1, 2**40]"  # counts of steps: far beyond any run, small enough for float arithmetic


@dataclass(frozen=True)
class Range:
    """An interval such as ``[0, 1)`` or ``(0, inf)``, shown as users read it: ``> 0``."""

    text: str
    low: float
    high: float
    low_open: bool
    high_open: bool
    why: str = ""

    @classmethod
    def parse(cls, text: str, why: str = "") -> Range:
        match = re.fullmatch(r"([\[(])(\S+), (\S+)([\])])", text)
        if not match:
            raise ValueError(f"bad range {text!r}")  # internal: a typo in a field declaration
        opening, low, high, closing = match.groups()
        return cls(text, _number(low), _number(high), opening == "(", closing == ")", why)

    def __contains__(self, value: float) -> bool:
        # Written as "is inside" so that NaN, which compares false to everything, is outside
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def rule(self, nullable: bool = False) -> str:
        low = self.text[1:-1].split(", ")[0]
        if self.high == float("inf"):
            text = f"{'>' if self.low_open else '>='} {low}"
        else:
            text = f"in {self.text}"
        return text + (" or null" if nullable else "") + (f", {self.why}" if self.why else "")


def _number(text: str) -> float:
    if text.startswith("2**"):
        return 2 ** int(text[3:])
    return float(text) if any(c in text for c in ".en") else int(text)


def ranged(default: Any, interval: str, why: str = "") -> Any:
    """A dataclass field whose value (when not None) must lie in ``interval``."""
    return field(default=default, metadata={"range": Range.parse(interval, why)})


def is_hub_user_name(name: str) -> bool:
    """A name the Hub could have given a user or org (its repo-id namespace rule)."""
    return bool(HUB_USER_RE.fullmatch(name)) and "--" not in name and ".." not in name

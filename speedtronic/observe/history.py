"""Loss history at a glance: unicode-block sparklines, and a run's metrics JSONL read back.

``sparkline`` maps a series (NaN-safe, downsampled to a width) to ``▁▂▃▄▅▆▇█``; ``LossSeries``
keeps a bounded history for the live table and the final summary; ``read_history`` reads
the ``train_step`` and ``eval`` records of a metrics JSONL (``logging.json_file``) for
``ckpt inspect``, capped in bytes so a huge file still answers at once. Stdlib only.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

BLOCKS = "▁▂▃▄▅▆▇█"
GAP = " "  # a stretch with no finite value (NaN or inf losses)
WIDTH = 40
# read_history: files above this many bytes are read as their first HEAD_BYTES plus their tail.
MAX_READ_BYTES = 8 << 20
HEAD_BYTES = 1 << 20
MAX_POINTS = 100  # points listed in read_history's "losses" / "eval_losses"


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite real number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)  # a 400-digit integer in a hand-edited file overflows here
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def downsample(values: Sequence[Any], width: int = WIDTH) -> list[float | None]:
    """At most ``width`` buckets, each the mean of its finite values (None when it has none)."""
    if width < 1:
        return []
    n = len(values)
    if n <= width:
        return [finite(v) for v in values]
    buckets: list[float | None] = []
    for i in range(width):
        part = values[i * n // width : (i + 1) * n // width]
        chunk = [x for x in map(finite, part) if x is not None]
        buckets.append(sum(chunk) / len(chunk) if chunk else None)
    return buckets


def sparkline(values: Sequence[Any], width: int = WIDTH) -> str:
    """``values`` as unicode blocks, lowest ``▁`` to highest ``█``, at most ``width`` long.

    Non-finite values are skipped when scaling and drawn as a gap (a space) where a whole
    bucket has none; a flat series is drawn at mid height. ``[]`` gives ``""``.
    """
    buckets = downsample(values, width)
    seen = [v for v in buckets if v is not None]
    if not seen:
        return GAP * len(buckets)
    low, high = min(seen), max(seen)
    span = high - low
    flat = not math.isfinite(span) or span <= 1e-12 * max(1.0, abs(high))  # inf: +-1e308
    top = len(BLOCKS) - 1
    return "".join(
        GAP
        if v is None
        else BLOCKS[top // 2 if flat else min(top, int((v - low) / span * top + 0.5))]
        for v in buckets
    )


class LossSeries:
    """A bounded ``(step, value)`` history at even resolution, for long runs too.

    Each point is the mean of ``stride`` consecutive values (None when none of them is
    finite); past ``cap`` points, neighbours merge in pairs and ``stride`` doubles. first /
    last / min (and its step) stay exact whatever the merging; non-finite values are gaps in
    the sparkline and never the min.
    """

    def __init__(self, cap: int = 512):
        self.cap = max(2, cap)
        self.points: list[tuple[int, float | None]] = []
        self.stride = 1
        self._pending: list[float | None] = []  # values towards the next point
        self.count = 0
        self.first: tuple[int, float | None] | None = None
        self.last: tuple[int, float | None] | None = None
        self.min: tuple[int, float] | None = None

    def add(self, step: int, value: Any) -> None:
        value = finite(value)
        self.count += 1
        self.first = self.first or (step, value)
        self.last = (step, value)
        if value is not None and (self.min is None or value < self.min[1]):
            self.min = (step, value)
        self._pending.append(value)
        if len(self._pending) < self.stride:
            return
        self.points.append((step, _mean(self._pending)))
        self._pending = []
        if len(self.points) > self.cap:
            pairs = zip(self.points[0::2], self.points[1::2], strict=False)
            merged = [(b[0], _mean([a[1], b[1]])) for a, b in pairs]
            if len(self.points) % 2:  # the odd one out waits for its partner
                self._pending = [self.points[-1][1]] * self.stride
            self.points, self.stride = merged, self.stride * 2

    def values(self) -> list[float | None]:
        tail = [_mean(self._pending)] if self._pending else []
        return [v for _, v in self.points] + tail

    def sparkline(self, width: int = WIDTH) -> str:
        return sparkline(self.values(), width)

    def describe(self, width: int = WIDTH) -> str:
        """``▇▅▃▂▁ 5.5436 -> 2.1023 (min 2.0950 at step 140)``; "" before the first point."""
        if self.first is None or self.last is None:
            return ""
        low = f" (min {self.min[1]:.4f} at step {self.min[0]})" if self.min else ""
        return f"{self.sparkline(width)} {_fmt(self.first[1])} -> {_fmt(self.last[1])}{low}"


def _mean(values: Iterable[float | None]) -> float | None:
    seen = [x for x in values if x is not None]
    return sum(seen) / len(seen) if seen else None


def _fmt(value: float | None) -> str:
    return "nan" if value is None else f"{value:.4f}"


# ---- a run's metrics JSONL, read back ------------------------------------------------------


def read_history(path: str | os.PathLike, max_bytes: int = MAX_READ_BYTES) -> dict[str, Any]:
    """The loss and eval history in a metrics JSONL, as a JSON-ready dict.

    Only ``train_step`` and ``eval`` records count; a step that comes again (a resumed run
    redoing steps, or a fresh run appended to the same file) replaces what followed it, so
    the history is the last run's. Files over ``max_bytes`` are read as their first
    ``HEAD_BYTES`` and their last ``max_bytes - HEAD_BYTES`` (``truncated`` is then true).
    Unreadable lines (a cut last line, garbage) are skipped. OSError propagates.
    """
    lines, truncated = read_lines(Path(path), max_bytes)
    losses: list[tuple[int, float | None]] = []
    evals: list[tuple[int, float | None]] = []
    for line in lines:
        if '"train_step"' not in line and '"eval"' not in line:
            continue  # cheap: most other records are never parsed
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(record, dict):
            continue
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            continue
        if record.get("event") == "train_step":
            if losses and step <= losses[-1][0]:
                losses = [p for p in losses if p[0] < step]
                evals = [p for p in evals if p[0] < step]
            losses.append((step, finite(record.get("loss"))))
        elif record.get("event") == "eval":
            if evals and step <= evals[-1][0]:
                evals = [p for p in evals if p[0] < step]
            evals.append((step, finite(record.get("eval_loss"))))
    return {
        "path": str(path),
        "truncated": truncated,
        **_summary(losses, "loss"),
        **_summary(evals, "eval_loss"),
    }


def _summary(points: list[tuple[int, float | None]], name: str) -> dict[str, Any]:
    """``{name}_points``, first/last/min and the sparkline of a series, plus up to
    ``MAX_POINTS`` of its points (evenly picked, the first and last always among them)."""
    seen = [(s, v) for s, v in points if v is not None]
    low = min(seen, key=lambda p: p[1]) if seen else (None, None)
    plural = "losses" if name == "loss" else "eval_losses"
    return {
        f"{name}_points": len(points),
        f"first_{name}": points[0][1] if points else None,
        f"last_{name}": points[-1][1] if points else None,
        f"last_{name}_step": points[-1][0] if points else None,
        f"min_{name}": low[1],
        f"min_{name}_step": low[0],
        f"{name}_sparkline": sparkline([v for _, v in points]),
        plural: [{"step": s, name: v} for s, v in _pick(points, MAX_POINTS)],
    }


def _pick(items: Sequence[Any], count: int) -> list[Any]:
    if len(items) <= count:
        return list(items)
    return [items[round(i * (len(items) - 1) / (count - 1))] for i in range(count)]


def read_lines(path: Path, max_bytes: int = MAX_READ_BYTES) -> tuple[Iterable[str], bool]:
    """The lines of a JSONL file, at most ``max_bytes`` of it: a long file's head and tail
    (the bool says it was cut). Also what ``runs compare`` reads a run's curves with."""
    size = path.stat().st_size
    with path.open("rb") as f:
        if size <= max_bytes:
            return f.read().decode("utf-8", "replace").splitlines(), False
        head = f.read(min(HEAD_BYTES, max_bytes // 2))
        f.seek(size - (max_bytes - len(head)))
        tail = f.read()
    # the head's last line and the tail's first are cut: drop both
    lines = head.decode("utf-8", "replace").splitlines()[:-1]
    return lines + tail.decode("utf-8", "replace").splitlines()[1:], True

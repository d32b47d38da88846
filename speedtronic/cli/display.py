"""Progress rendering: a Rich live table on a terminal, plain lines otherwise. Never both.

A display is a MetricLogger hook (``on_event``). Progress goes to stderr; the final summary
line goes to stdout, where scripts read data.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from speedtronic.metrics import format_event


def make_display() -> Any:
    return LiveTable() if sys.stderr.isatty() else PlainLines()


class PlainLines:
    """One line per event on stderr; the run summary on stdout."""

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        line = format_event(event, payload)
        if line:
            print(line, file=sys.stdout if event == "run_end" else sys.stderr, flush=True)

    def close(self) -> None:
        return None


class LiveTable:
    """The last log rows of the run as a table, refreshed ~4 times a second."""

    def __init__(self, rows: int = 12):
        self.console = Console(stderr=True)
        self.rows: deque[dict[str, Any]] = deque(maxlen=rows)
        self.facts: dict[str, Any] = {}
        self.diloco: dict[str, Any] = {}  # the last boundary of a DumbDiLoCo node
        self.live: Live | None = None

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        if event == "run_start":
            self.facts = payload
            self.live = Live(self._render(), console=self.console, refresh_per_second=4)
            self.live.start()
        elif event == "train_step":
            self.rows.append({**payload, "global": self.diloco.get("outer_step")})
            if self.live:
                self.live.update(self._render())
        elif event == "eval":
            for row in self.rows:  # shown on the row of the step it belongs to
                if row["step"] == payload["step"]:
                    row["eval_loss"] = payload["eval_loss"]
            if self.live:
                self.live.update(self._render())
        elif event in ("diloco_boundary", "diloco_round"):
            self.diloco.update(payload if event == "diloco_boundary" else {})
            self.console.print(format_event(event, payload), style="magenta", highlight=False)
        elif event in ("warning", "notice"):
            style = "yellow" if event == "warning" else "cyan"
            self.console.print(f"[{style}]{event}:[/] {payload['message']}", highlight=False)
        elif event == "run_end":
            self.close()
            print(format_event(event, payload), flush=True)

    def close(self) -> None:
        if self.live:
            self.live.stop()
            self.live = None

    def _render(self) -> Table:
        f = self.facts
        title = (
            f"{f.get('name')} - {f.get('model')} {f.get('params', 0) / 1e6:.2f}M params on "
            f"{f.get('device')} ({f.get('precision')}, {f.get('optimizer')})"
        )
        table = Table(title=title, title_justify="left", expand=False)
        columns = ["step", "loss", "eval loss", "lr", "tok/s", "MFU", "data wait", "memory", "ETA"]
        diloco = bool(self.diloco)
        for column in columns + (["global", "uploads", "stall"] if diloco else []):
            table.add_column(column, justify="right")
        for row in self.rows:
            table.add_row(*_cells(row), *(_diloco_cells(row, self.diloco) if diloco else []))
        return table


def _cells(row: dict[str, Any]) -> list[str]:
    remaining = row["max_steps"] - row["step"]
    eta = remaining / row["steps_per_s"] if row["steps_per_s"] > 0 else 0.0
    return [
        f"{row['step']}/{row['max_steps']}",
        f"{row['loss']:.4f}",
        f"{row['eval_loss']:.4f}" if "eval_loss" in row else "",
        f"{row['lr']:.2e}",
        f"{row['tokens_per_s']:,.0f}",
        "-" if row.get("mfu") is None else f"{row['mfu']:.1%}",
        f"{row['data_wait_share']:.1%}",
        "-" if row.get("memory_gb") is None else f"{row['memory_gb']:.2f} GB",
        _duration(eta),
    ]


def _diloco_cells(row: dict[str, Any], last: dict[str, Any]) -> list[str]:
    """The global outer step this row trained from; the node's latest upload figures."""
    failed = f" ({last['upload_failures']} failed)" if last.get("upload_failures") else ""
    return [
        "-" if row.get("global") is None else str(row["global"]),
        f"{last.get('uploads', 0)}{failed}",
        f"{last.get('stall_s', 0.0) * 1000:.0f} ms",
    ]


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"

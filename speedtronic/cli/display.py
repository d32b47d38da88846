"""Progress rendering: a Rich live table on a terminal, plain lines otherwise, or JSON events.

A display is a MetricLogger hook (``on_event``). In text mode progress goes to stderr and the
final summary (with the loss sparkline) to stdout, where scripts read data. In JSON mode
(``train --log-format json``) stdout carries only event records, one per line
(docs/events.md), and everything meant for people goes to stderr.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections import deque
from typing import IO, Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from speedtronic.observe.history import LossSeries
from speedtronic.observe.metrics import (
    LEVELS,
    UNCAPPED_STEPS,
    format_event,
    record_line,
    shown_at,
    steps_text,
)

# Events people read (stderr) rather than scripts (the JSON stream).
HUMAN_EVENTS = ("warning", "notice")


def make_display(log_format: str = "text", out: IO[str] | None = None, level: str = "info") -> Any:
    """JSON events (every event, whatever the level), else the live table on a terminal, or
    plain lines. Above ``info`` only warnings are worth showing: plain lines, filtered."""
    if log_format == "json":
        return JsonEvents(out)
    if sys.stderr.isatty() and LEVELS[level] <= LEVELS["info"]:
        return LiveTable()
    return PlainLines(level)


class Losses:
    """The run's train and eval loss history, for the sparkline lines of the summary."""

    def __init__(self) -> None:
        self.train, self.eval = LossSeries(), LossSeries()

    def record(self, event: str, payload: dict[str, Any]) -> None:
        if event == "train_step":
            self.train.add(payload["step"], payload.get("loss"))
        elif event == "eval":
            self.eval.add(payload["step"], payload.get("eval_loss"))
        elif event == "run_end":  # a run ending between log lines: its last loss is logged here
            steps, last = payload.get("steps"), self.train.last
            if isinstance(steps, int) and payload.get("final_loss") is not None:
                if last is None or last[0] < steps:
                    self.train.add(steps, payload["final_loss"])

    def lines(self) -> list[str]:
        """``loss ▇▅▃▂▁ 5.5436 -> 2.1023 (min ...)`` and the same for eval, when logged."""
        pairs = (("loss", self.train), ("eval loss", self.eval))
        return [f"{label}: {series.describe()}" for label, series in pairs if series.count]


def print_summary(payload: dict[str, Any], losses: Losses, stream: IO[str]) -> None:
    """The final summary: the ``done:`` line, then the loss (and eval loss) sparklines.

    A stream that cannot encode the blocks (a Latin-1 locale) gets ``?`` in their place.
    """
    text = "\n".join([format_event("run_end", payload), *losses.lines()])
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        text = text.encode(encoding, "replace").decode(encoding, "replace")
    except LookupError:  # an encoding Python does not know: leave it to print
        pass
    print(text, file=stream, flush=True)


class PlainLines:
    """One line per event of ``level`` or above on stderr; the run summary on stdout."""

    def __init__(self, level: str = "info") -> None:
        self.losses = Losses()
        self.min_level = LEVELS[level]

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        self.losses.record(event, payload)
        if event == "run_end":
            print_summary(payload, self.losses, sys.stdout)
            return
        line = format_event(event, payload) if shown_at(event, self.min_level) else ""
        if line:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        return None


class JsonEvents:
    """``--log-format json``: every event but warnings and notices as one JSON line on
    ``out`` (stdout); warnings, notices and the final summary as text on stderr.

    Nothing follows ``run_end``, and lines from several threads never interleave.
    """

    def __init__(self, out: IO[str] | None = None) -> None:
        self.out = out or sys.stdout
        self.losses = Losses()
        self.ended = False
        self._lock = threading.Lock()

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        if event in HUMAN_EVENTS:
            print(format_event(event, payload), file=sys.stderr, flush=True)
            return
        with self._lock:
            if self.ended:
                return
            self.ended = event == "run_end"
            try:
                self.out.write(record_line(event, payload) + "\n")
                self.out.flush()
            except BrokenPipeError:  # the reader went away (| head): stop as on SIGPIPE
                self.ended = True
                print("speedtronic: the event stream's reader closed it; stopping", file=sys.stderr)
                signal.raise_signal(signal.SIGTERM)  # a clean stop, with its checkpoint
                return
        self.losses.record(event, payload)
        if event == "run_end":
            print_summary(payload, self.losses, sys.stderr)

    def close(self) -> None:
        return None


class LiveTable:
    """The last log rows of the run as a table, refreshed ~4 times a second."""

    def __init__(self, rows: int = 12):
        self.console = Console(stderr=True)
        self.rows: deque[dict[str, Any]] = deque(maxlen=rows)
        self.facts: dict[str, Any] = {}
        self.diloco: dict[str, Any] = {}  # the last boundary of a DumbDiLoCo node
        self.losses = Losses()
        self.live: Live | None = None

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        self.losses.record(event, payload)
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
        elif event == "eval_set":  # a line per held-out set above the table: sets vary in number
            self.console.print(format_event(event, payload), style="green", highlight=False)
        elif event in ("diloco_boundary", "diloco_round"):
            self.diloco.update(payload if event == "diloco_boundary" else {})
            self.console.print(format_event(event, payload), style="magenta", highlight=False)
        elif event in ("warning", "notice"):
            style = "yellow" if event == "warning" else "cyan"
            self.console.print(f"[{style}]{event}:[/] {payload['message']}", highlight=False)
        elif event == "run_end":
            if self.live:  # the table stays on screen: without the sparklines the summary prints
                self.live.update(self._render(caption=False), refresh=True)
            self.close()
            print_summary(payload, self.losses, sys.stdout)

    def close(self) -> None:
        if self.live:
            self.live.stop()
            self.live = None

    def _render(self, caption: bool = True) -> Table:
        """The table; its caption holds the live loss sparklines (the summary's, at the end)."""
        f = self.facts
        title = (
            f"{f.get('name')} - {f.get('model')} {f.get('params', 0) / 1e6:.2f}M params on "
            f"{f.get('device')} ({f.get('precision')}, {f.get('optimizer')})"
        ) + (f"\ndata: {f['data']}" if f.get("data") else "")
        caption = "\n".join(self.losses.lines()) if caption else None
        table = Table(
            title=title,
            title_justify="left",
            caption=caption or None,
            caption_justify="left",
            expand=False,
        )
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
    uncapped = row["max_steps"] >= UNCAPPED_STEPS  # a time budget alone ends the run
    return [
        steps_text(row["step"], row["max_steps"]),
        f"{row['loss']:.4f}",
        f"{row['eval_loss']:.4f}" if "eval_loss" in row else "",
        f"{row['lr']:.2e}",
        f"{row['tokens_per_s']:,.0f}",
        "-" if row.get("mfu") is None else f"{row['mfu']:.1%}",
        f"{row['data_wait_share']:.1%}",
        "-" if row.get("memory_gb") is None else f"{row['memory_gb']:.2f} GB",
        "-" if uncapped else _duration(eta),
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

"""How ``train`` shows its run summary (``observe/summary.py`` builds and stores it).

Text: a fixed block of ``summary: KEY VALUE`` lines, one per field in the document's order
(``-`` for unknown, eval sets as ``eval.SET.loss`` and ``eval.SET.bits_per_byte``), so
``grep '^summary: '`` reads it; the config and the curves stay in summary.json. JSON
(``train --format json``): the document itself, strict, on stdout.
"""

from __future__ import annotations

import sys
from typing import IO, Any

from speedtronic.cli.jsonout import json_text

# Fields of the block, in order: everything in summary.json but the config and the curves.
BLOCK_FIELDS = (
    "name status error stop_reason started_at ended_at steps tokens trained_tokens train_s "
    "startup_s time_budget_s params tokens_per_s mfu peak_memory_bytes optimizer "
    "final_train_loss eval config_sha256 changed_keys tokenizer role node_id outer_step"
).split()


def summary_lines(doc: dict[str, Any]) -> list[str]:
    lines = []
    for key in BLOCK_FIELDS:
        value = doc.get(key)
        if key == "eval":
            for name, figures in (value or {}).items():
                lines += [f"summary: eval.{name}.{k} {_text(v)}" for k, v in figures.items()]
        elif key == "changed_keys":
            lines.append(f"summary: {key} {','.join(value) if value else '-'}")
        elif key == "tokenizer":
            lines.append(f"summary: {key} {_tokenizer_text(value)}")
        else:
            lines.append(f"summary: {key} {_text(value)}")
    return lines


def show_summary(doc: dict[str, Any] | None, as_json: bool, events_on_stdout: bool) -> None:
    """The JSON document, or the block: on stdout, or on stderr when JSON events hold it."""
    if not doc:  # another DDP rank's, or a summary that could not be built (warned)
        return
    if as_json:
        print(json_text(doc), flush=True)
        return
    stream: IO[str] = sys.stderr if events_on_stdout else sys.stdout
    print("\n".join(summary_lines(doc)), file=stream, flush=True)


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return " ".join(str(value).split())  # one line, whatever the error said


def _tokenizer_text(record: dict[str, Any] | None) -> str:
    if not record:
        return "-"
    sha = f" sha256 {record['sha256']}" if record.get("sha256") else ""
    return f"{record.get('kind')} vocab {record.get('vocab_size')}{sha}"

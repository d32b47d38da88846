"""The tokenize pipeline's worker side: one unit in, its tokens out (run in a process per core).

``init`` builds the process's ``Reader`` and ``Encoder`` once (the tokenizer loads from the
output folder's copy, so what is recorded is what tokenized); ``work`` reads a unit and encodes
it. A bad-input ``SpeedtronicError`` comes back as a value, not a pickled exception, so its
message and hint reach the user intact; SIGINT is ignored here, so Ctrl-C is the main
process's to handle (it commits what is done first), and a worker whose parent died (SIGKILL)
exits on its own. No torch is imported on this side.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

from speedtronic.data.ingest.encode import Encoded, Encoder, Separator
from speedtronic.data.ingest.formats import Reader, Unit
from speedtronic.errors import SpeedtronicError


@dataclass(frozen=True)
class Task:
    unit: Unit
    format: str
    path: str
    name: str
    held_out: bool = False  # a text file's whole document is in the validation part


@dataclass(frozen=True)
class Setup:
    tokenizer_file: str | None
    separator: dict
    val_fraction: float
    dtype: str
    column: str
    max_document_bytes: int
    chat: dict | None = None  # the plan's chat record, and "path": the template's copy


_STATE: dict = {}


def init(setup: Setup, parent: int | None = None) -> None:
    """Build this process's reader and encoder. In a worker process, ``parent`` is the pid of
    the process that started the pool: SIGINT is ignored and the worker ends once it is gone."""
    if parent is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _exit_with_parent(parent)
    separator = Separator.from_record(setup.separator)
    _STATE["encoder"] = Encoder(setup.tokenizer_file, separator, setup.val_fraction, setup.dtype)
    chat = setup.chat
    column = chat["messages_key"] if chat else setup.column
    _STATE["reader"] = Reader(column, setup.max_document_bytes, chat is not None)
    _STATE["chat"] = None  # a process may run one tokenize after another (--workers 1)
    if chat:
        from pathlib import Path

        from speedtronic.data.ingest.chat import Conversations

        template = Path(chat["path"]).read_text(encoding="utf-8")
        _STATE["chat"] = Conversations(chat, template, _STATE["encoder"]._impl)


def _exit_with_parent(parent: int) -> None:
    """End this worker once ``parent`` is gone (killed with SIGKILL, say): every worker holds
    the task queue's write end too, so the read it blocks in would never see EOF. The pid comes
    from the parent: read here, a worker still starting when its parent died would take init's
    pid for its parent's and run on for good (seen in CI, blocked on a dead sibling's lock)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def work(task: Task) -> Encoded | tuple[str, str | None]:
    """``task``'s tokens, or ``(message, hint)`` for bad input."""
    encoder, reader = _STATE["encoder"], _STATE["reader"]
    try:
        if task.format == "text":
            text = reader.text(task.unit, task.path, task.name)
            return encoder.text(text, task.unit.first, task.held_out)
        docs, skipped = reader.documents(task.unit, task.format, task.path, task.name)
        if _STATE["chat"] is not None:
            from speedtronic.data.ingest.chat import encode_unit

            return encode_unit(_STATE["chat"], encoder, docs, skipped)
        return encoder.documents(docs, skipped)
    except SpeedtronicError as exc:
        message = str(exc)
        if not message.startswith(task.name):
            message = f"{task.name}: {message}"
        return message, exc.hint

"""Metrics: the ``MetricLogger`` event fan-out, its sinks, the JSON event record, and the
device peak-FLOPs table.

The engine reports everything as ``(event, payload)`` pairs: ``run_start``, ``train_step``,
``eval``, ``eval_set``, ``checkpoint``, ``warning``, ``notice``, ``run_end`` and DumbDiLoCo's
``diloco_*``.
Sinks write them (stdout lines, a text file, JSONL) and hooks receive them (callables
``hook(event, payload)`` or objects with ``on_event``). A hook that raises is reported once
and disabled, never fatal. ``event_record`` is the one JSON form of an event, versioned
(``EVENT_SCHEMA_VERSION``, docs/events.md): the JSONL file and ``train --log-format json``
both write it. A log file that cannot be written (a full disk) stops the run with an
``OutputError`` naming the config key and the file, raised on the main thread.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from speedtronic.errors import ConfigError, OutputError

Hook = Callable[[str, dict[str, Any]], None]

# The JSON record's version (docs/events.md): bumped when a field is renamed, removed or changes
# meaning or unit; adding events or fields keeps it.
EVENT_SCHEMA_VERSION = 1
ENVELOPE = ("event", "schema_version", "time")
# Payload names that break the record's conventions (the unit last: _s, _bytes), renamed in
# every record; hooks still receive the engine's names. memory_gb also becomes whole bytes.
RENAMED = {
    "memory_gb": "memory_bytes",
    "bytes": "size_bytes",
    "bytes_up": "uploaded_bytes",
    "bytes_down": "downloaded_bytes",
    "total_bytes_down": "total_downloaded_bytes",
    "seconds": "elapsed_s",
}
# run.max_steps's ceiling (config.rules.STEPS): what --time-budget alone sets, so that the
# clock alone ends the run; a step count shows without it.
UNCAPPED_STEPS = 2**40
# The config keys of the log files, named by every error about them.
TEXT_KEY, JSON_KEY = "logging.file", "logging.json_file"
# logging.level filters the plain lines (console, text file); JSONL and hooks get every event.
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
EVENT_LEVELS = {"warning": LEVELS["warning"]}  # every other event is info

# Dense peak TFLOPS per device for the autocast dtype (bf16/fp16) and for fp32 (TF32 on CUDA).
# Vendor figures without sparsity. Matched by substring of the device name, first match wins.
PEAK_TFLOPS: list[tuple[str, float, float]] = [
    ("H200", 989.0, 494.0),
    ("H100 PCIe", 756.0, 378.0),
    ("H100", 989.0, 494.0),
    ("GH200", 989.0, 494.0),
    ("B200", 2250.0, 1100.0),
    ("A100", 312.0, 156.0),
    ("A10G", 125.0, 31.2),
    ("A10", 125.0, 62.5),
    ("L40S", 362.0, 183.0),
    ("L4", 121.0, 60.0),
    ("RTX 4090", 165.0, 82.6),
    ("RTX 3090", 71.0, 35.6),
    ("V100", 125.0, 15.7),
    ("T4", 65.0, 8.1),
]


def peak_flops(device_name: str, low_precision: bool) -> float | None:
    """Vendor peak FLOP/s for a device name, or None when the device is not in the table."""
    for key, low, full in PEAK_TFLOPS:
        if key in device_name:
            return (low if low_precision else full) * 1e12
    return None


class MetricLogger:
    """Fans events out to sinks and hooks.

    ``console``: print one plain line per ``train_step`` (and notices) to stdout.
    ``file`` / ``json_file``: append text lines / ``event_record`` JSON lines (one per event).
    ``hooks``: callables ``(event, payload)`` or objects with ``on_event(event, payload)``.
    ``level``: the least level (``LEVELS``) a plain line needs to be printed or written.
    """

    def __init__(
        self,
        console: bool = True,
        file: str | Path | None = None,
        json_file: str | Path | None = None,
        hooks: list[Any] | None = None,
        stream: IO[str] | None = None,
        level: str = "info",
    ):
        self.console = console
        self.min_level = LEVELS[level]
        self.stream = stream
        self.text_path = Path(file) if file is not None else None
        self._text = _open_append(file, TEXT_KEY)
        self.json_path = Path(json_file) if json_file is not None else None
        self._json = _open_append(json_file, JSON_KEY)
        self._lock = threading.Lock()  # DumbDiLoCo logs from its threads too
        self._failure: OutputError | None = None  # a sink that failed, for the main thread
        self.hooks: list[Hook] = [_as_callable(h) for h in hooks or []]

    def add_hook(self, hook: Any) -> None:
        self.hooks.append(_as_callable(hook))

    def log(self, event: str, payload: dict[str, Any]) -> None:
        line = format_event(event, payload) if shown_at(event, self.min_level) else ""
        if self.console and line:
            print(line, file=self.stream or sys.stdout, flush=True)
        with self._lock:
            if self._text and line:
                self._text = self._write(self._text, line, TEXT_KEY, self.text_path)
            if self._json:
                self._json = self._write(
                    self._json, record_line(event, payload), JSON_KEY, self.json_path
                )
        for hook in list(self.hooks):
            try:
                hook(event, payload)
            except Exception as exc:  # a broken hook must not end a training run
                if hook not in self.hooks:
                    continue  # already disabled (its warning's own log call, another thread)
                self.hooks.remove(hook)
                self.log(
                    "warning",
                    {
                        "message": f"logging hook {_name(hook)} failed and was "
                        f"disabled: {type(exc).__name__}: {exc}"
                    },
                )
        self._raise_failure()

    def _write(self, handle: IO[str], line: str, key: str, path: Path | None) -> IO[str] | None:
        """Write and flush one line; on an OSError close the sink and keep the error to raise.

        The sink is dropped so that the run's last words (the error, a final checkpoint's
        event) can still reach the other sinks; what it held before stays as written.
        """
        try:
            handle.write(line + "\n")
            handle.flush()
            return handle
        except OSError as exc:
            _close_quietly(handle)
            if self._failure is None:
                self._failure = OutputError(f"{key}: cannot write {path}: {_reason(exc)}")
            return None

    def _raise_failure(self) -> None:
        """Raise a sink's failure on the main thread (a DiLoCo thread logging must not die of
        it: the main thread's next event stops the run, and says which file)."""
        if self._failure is not None and threading.current_thread() is threading.main_thread():
            failure, self._failure = self._failure, None
            raise failure

    def warn(self, message: str) -> None:
        self.log("warning", {"message": message})

    def notice(self, message: str) -> None:
        self.log("notice", {"message": message})

    def drop_records_after(self, step: int) -> None:
        """Remove JSONL records of steps after ``step`` (logged before a crash, redone on resume).

        The file is rewritten atomically and reopened, so a kill here loses nothing. Only a
        regular file is: the rename would replace a device such as /dev/null with a file.
        """
        if self._json is None or self.json_path is None or not self.json_path.is_file():
            return
        self._json.close()
        kept = []
        tmp = self.json_path.with_name(self.json_path.name + ".tmp")
        try:
            for line in self.json_path.read_text(encoding="utf-8").splitlines(keepends=True):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by a kill
                    continue
                if not (isinstance(record.get("step"), int) and record["step"] > step):
                    kept.append(line)
            tmp.write_text("".join(kept), encoding="utf-8")
            os.replace(tmp, self.json_path)
        except OSError as exc:  # the original is intact: the rewrite goes to a sibling first
            tmp.unlink(missing_ok=True)
            raise OutputError(
                f"{JSON_KEY}: cannot rewrite {self.json_path}: {_reason(exc)}"
            ) from None
        self._json = _open_append(self.json_path, JSON_KEY)

    def close(self) -> None:
        sinks = ((self._text, TEXT_KEY, self.text_path), (self._json, JSON_KEY, self.json_path))
        self._text = self._json = None
        failure = None
        for handle, key, path in sinks:
            try:
                if handle:
                    handle.close()  # flushes: a full disk can show here first
            except OSError as exc:
                failure = failure or OutputError(f"{key}: cannot write {path}: {_reason(exc)}")
        if failure is not None:
            raise failure


def shown_at(event: str, min_level: int) -> bool:
    """Whether ``event``'s plain line passes a ``logging.level`` of ``min_level``."""
    return EVENT_LEVELS.get(event, LEVELS["info"]) >= min_level


def event_record(event: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The JSON form of an event: ``event``, ``schema_version``, ``time`` (unix seconds), then
    the payload with ``RENAMED`` names, non-finite numbers as null and tensors as numbers."""
    record: dict[str, Any] = {
        "event": event,
        "schema_version": EVENT_SCHEMA_VERSION,
        "time": round(time.time(), 3),
    }
    for key, value in payload.items():
        name = RENAMED.get(key, key)
        if name in ENVELOPE:
            continue
        value = json_safe(value)
        if key == "memory_gb" and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = round(value * 1e9)
        record[name] = value
    return record


def record_line(event: str, payload: dict[str, Any]) -> str:
    """``event_record`` as one line of strict JSON (no NaN, no newline)."""
    return json.dumps(event_record(event, payload), allow_nan=False)


def json_safe(value: Any) -> Any:
    """A JSON-safe copy: non-finite floats -> None, tensor scalars -> numbers, other -> str."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item"):
        try:
            return json_safe(value.item())
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


def steps_text(step: int, max_steps: int) -> str:
    """``12/150``, or ``12`` when only a time budget ends the run."""
    return str(step) if max_steps >= UNCAPPED_STEPS else f"{step}/{max_steps}"


def _step_cap(max_steps: int) -> str:
    return "no step cap" if max_steps >= UNCAPPED_STEPS else f"{max_steps} steps"


def _bits(value: Any) -> str:
    return f" | bits/byte {value:.4f}" if isinstance(value, float) else ""


def _trained(payload: dict[str, Any]) -> str:
    """An SFT run's labels learned from, where fewer than its tokens (issue 56)."""
    trained = payload.get("trained_tokens")
    if not isinstance(trained, int) or trained == payload.get("tokens"):
        return ""
    return f", {trained:,} tokens trained on"


def format_event(event: str, payload: dict[str, Any]) -> str:
    """The plain one-line form of an event (what non-TTY output and text files show)."""
    if event == "train_step":
        parts = [
            f"step {steps_text(payload['step'], payload['max_steps'])}",
            f"loss {payload['loss']:.4f}",
            f"lr {payload['lr']:.2e}",
            f"grad_norm {payload['grad_norm']:.3f}",
            f"tok/s {payload['tokens_per_s']:,.0f}",
            f"data_wait {payload['data_wait_share']:.1%}",
        ]
        trained = payload.get("trained_tokens_per_s")
        if trained is not None and payload.get("trained_tokens") != payload.get("tokens"):
            parts.insert(5, f"trained tok/s {trained:,.0f}")  # SFT: the labels not masked
        if payload.get("mfu") is not None:
            parts.append(f"mfu {payload['mfu']:.1%}")
        if payload.get("memory_gb") is not None:
            parts.append(f"mem {payload['memory_gb']:.2f}GB")
        return " | ".join(parts)
    if event == "eval":
        return (
            f"eval step {payload['step']} | eval_loss {payload['eval_loss']:.4f} | "
            f"ppl {payload['eval_ppl']:.2f} | {payload['eval_tokens']:,} tokens"
            + _bits(payload.get("eval_bits_per_byte"))
        )
    if event == "eval_set":
        return (
            f"eval step {payload['step']} | set {payload['set']} | loss {payload['loss']:.4f} | "
            f"bits/byte {payload['bits_per_byte']:.4f} | {payload['tokens']:,} tokens"
        )
    if event in ("warning", "notice"):
        return f"{event}: {payload['message']}"
    if event in ("diloco_boundary", "diloco_round"):
        return _diloco_line(event, payload)
    if event == "diloco_install":
        return f"diloco install at step {payload['step']} | global {payload['outer_step']} (eager)"
    if event == "run_start" and "params" not in payload:  # a master that only coordinates
        return f"run {payload['name']}: DumbDiLoCo master on {payload.get('repo')}, no training"
    if event == "run_start":
        return (
            f"run {payload['name']}: {payload['model']} ({payload['params'] / 1e6:.2f}M params) "
            f"on {payload['device']} {payload['precision']}"
            + (f", {payload['optimizer']}" if payload.get("optimizer") else "")
            + f", {_step_cap(payload['max_steps'])}, "
            f"batch {payload['batch_size']} x {payload['seq_len']} tokens "
            f"(accumulation {payload['accumulation_steps']})"
            + (f"; data: {payload['data']}" if payload.get("data") else "")
        )
    if event == "run_end":
        loss = payload.get("final_loss")
        loss_text = f"{loss:.4f}" if loss is not None and math.isfinite(loss) else "n/a"
        return (
            f"done: {payload['steps']} steps, final loss {loss_text}, "
            f"{payload['tokens']:,} tokens in {payload['elapsed_s']:.1f}s "
            f"({payload['tokens_per_s']:,.0f} tok/s)"
            + _trained(payload)
            + f" - {payload['status']}"
        )
    return ""


def _open_append(path: str | Path | None, key: str) -> IO[str] | None:
    if path is None:
        return None
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("a", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{key}: cannot open log file {path}: {_reason(exc)}") from None


def _reason(exc: OSError) -> str:
    """The OS's words ("No space left on device"), without the errno and path noise."""
    return exc.strerror or str(exc) or type(exc).__name__


def _close_quietly(handle: IO[str]) -> None:
    try:
        handle.close()
    except OSError:
        pass  # the write that failed already said why


def _as_callable(hook: Any) -> Hook:
    if hasattr(hook, "on_event"):
        return hook.on_event
    if callable(hook):
        return hook
    raise TypeError(f"logging hook {hook!r} is neither callable nor has on_event")


def _name(hook: Hook) -> str:
    owner = getattr(hook, "__self__", None)
    return type(owner).__name__ if owner is not None else getattr(hook, "__name__", repr(hook))


_MOMENTUM_WORDS = {
    "off": "no outer momentum (plain averaging)",
    "applied": "outer momentum applied",
    # delayed Nesterov: the look-ahead waits until the rounds hold one inner loop of the fleet
    "pending": "outer momentum pending (until the rounds hold a whole fleet inner loop)",
}


def _diloco_line(event: str, p: dict[str, Any]) -> str:
    """DumbDiLoCo's plain lines: a node's boundary, or a master's round."""
    if event == "diloco_round":
        return (
            f"diloco round: outer step {p['outer_step']} | deltas {p['included']} in, "
            f"{p['stale']} stale, {p['bad']} rejected | {p['tokens']:,} tokens | "
            f"{_MOMENTUM_WORDS[p.get('momentum_state', 'applied' if p['momentum'] else 'off')]}"
        )
    installed = f" | installed global {p['installed']}" if p.get("installed") is not None else ""
    return (
        f"diloco boundary at step {p['step']} | stall {p['stall_s'] * 1000:.0f} ms{installed} | "
        f"global {p['outer_step']} | uploads {p['uploads']} ({p['upload_failures']} failed) | "
        f"up {p['bytes_up'] / 1e6:.1f} MB, down {p['bytes_down'] / 1e6:.1f} MB"
    )

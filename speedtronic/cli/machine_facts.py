"""What ``validate`` says about a config on this machine, one line each (issue 31).

``validate`` said nothing of what costs a user most after the quick start: which data a run
reads and whether its files exist, bf16 being emulated on this CPU (a shrunk GPT-2 step took
minutes), more DataLoader workers than cores, a model vocabulary far above what the data can
use. ``data_facts`` names the source and each file with its size (a missing file is a
problem: training would stop on it), and each token folder with what its manifest holds, its
files verified against it as training verifies them (``folder_facts``); ``precision_facts``
resolves the precision and runs the emulation probe only where it can matter, a low-precision
mode on a CPU (tens of ms, cached for the process); ``machine_warnings`` gathers the rest.
Engine imports live inside the functions, like the command bodies that call them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the config package loads with the command, not with --help
    from speedtronic.config import SpeedtronicConfig


def data_facts(cfg: SpeedtronicConfig) -> tuple[dict[str, Any], list[str]]:
    """``{"data": "text corpus.txt (1.2 MB, byte tokens)"}`` and the problems of its files."""
    from speedtronic.data.describe import source_line

    folders, problems = folder_facts(cfg)
    facts = {"data": source_line(cfg), **({"token_folders": folders} if folders else {})}
    return facts, file_problems(cfg) + problems


def folder_facts(cfg: SpeedtronicConfig) -> tuple[dict[str, Any], list[str]]:
    """Each token folder the run reads: what its manifest holds, and its files verified against
    it as training would (hashed once, then cached: data.integrity); or why it cannot train."""
    from speedtronic.data import manifest
    from speedtronic.data.integrity import verify_folder
    from speedtronic.errors import DataError

    facts: dict[str, Any] = {}
    problems: list[str] = []
    for key, path in _folders(cfg):
        try:
            doc = manifest.read_manifest(path, key)
            found = {"path": path, **manifest.summary(doc)}
            facts[key] = {**found, **verify_folder(path, doc, key).record()}
        except DataError as exc:
            problems.append(str(exc))
    return facts, problems


def _folders(cfg: SpeedtronicConfig) -> list[tuple[str, str]]:
    data = cfg.data
    if data.resolved_source != "tokens":
        return []
    keys = [("data.token_path", data.token_path), ("data.eval_path", data.eval_path)]
    return [(key, path) for key, path in keys if path and Path(path).is_dir()]


def _made_by(key: str) -> str:
    """How a missing token file or folder is made: the step a user skipped."""
    if key in ("data.token_path", "data.eval_path"):
        return " (run `speedtronic data tokenize SOURCES... PATH` first: docs/data.md)"
    return ""


def file_problems(cfg: SpeedtronicConfig) -> list[str]:
    """Each configured data file that training could not open, with its key (stat only: the
    UTF-8 and token-id checks read the whole file, so they run when training starts)."""
    data, problems = cfg.data, []
    keys = [("data.text_path", data.text_path), ("data.token_path", data.token_path)]
    keys.append(("data.eval_path", data.eval_path))
    if data.tokenizer != "byte" and data.resolved_source == "text":
        keys.append(("data.tokenizer", data.tokenizer))
    for key, path in keys:
        if not path:
            continue
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            problems.append(f"{key}: file not found: {path}{_made_by(key)}")
            continue
        except OSError as exc:
            problems.append(f"{key}: cannot read {path}: {exc.strerror or exc}")
            continue
        if Path(path).is_dir() and (key, path) not in _folders(cfg):  # folders: folder_facts
            problems.append(f"{key}: {path} is a directory, not a file")
        elif size == 0:
            problems.append(f"{key}: {path} is empty")
    return problems


def precision_facts(cfg: SpeedtronicConfig, device: Any) -> tuple[dict[str, Any], list[str]]:
    """The precision a run gets on ``device``, and why it is not the one asked for or is slow.

    The emulation probe (``precision.emulation_warning``, time-boxed) runs only for bf16/fp16
    on a CPU: fp32, and any mode on a GPU (``resolve_precision`` judges those), need none.
    """
    from speedtronic.train.precision import emulation_warning, resolve_precision

    warnings: list[str] = []
    precision = resolve_precision(cfg.precision.mode, device, warnings.append)
    emulated = emulation_warning(device, precision.mode)
    return {"precision": precision.mode}, warnings + ([emulated] if emulated else [])


def machine_warnings(cfg: SpeedtronicConfig) -> list[str]:
    """More workers than cores (as training will clamp or warn), and an oversized vocabulary."""
    from speedtronic.data.describe import vocab_warning
    from speedtronic.train.preflight import clamp_workers, worker_warning

    found: list[str] = []
    clamp_workers(cfg, None, found)
    found += [w for w in (worker_warning(cfg, None), vocab_warning(cfg)) if w]
    return found

"""Reading checkpoints: verify (sizes and sha256), load without unpickling, find the newest.

Model weights load through safetensors, the trainer state through
``torch.load(weights_only=True)``; files are hashed while they load and a mismatch discards
the data. ``find_latest`` / ``load_latest`` start at ``latest.json`` and fall back to older
checkpoints while verification fails, reporting each one skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from speedtronic.checkpoint.layout import (
    CHECKPOINT_FILES,
    MODEL_FILE,
    READ_CHUNK_BYTES,
    SAFETENSORS_FORMAT,
    STATE_FILE,
    error_reason,
    list_step_dirs,
    parse_step,
    read_latest,
    scan_checkpoint,
)
from speedtronic.errors import CheckpointError


@dataclass
class Checkpoint:
    """A loaded checkpoint: ``model_state`` fits ``model.load_state_dict(strict=True)``."""

    path: Path
    model_state: dict[str, torch.Tensor]
    trainer_state: dict[str, Any]
    meta: dict[str, Any]


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """``step_*`` dirs in ``root`` sorted by step (not verified; see ``find_latest``)."""
    return list_step_dirs(root)


def verify_checkpoint(path: str | os.PathLike) -> tuple[str, str | None]:
    """``(status, problem)``: the structural check plus sha256 of both files.

    status is "ok", "incomplete" or "damaged"; problem names the file and what is wrong.
    """
    scan = scan_checkpoint(path)
    if scan.status != "ok":
        return scan.status, scan.problem
    with ThreadPoolExecutor(max_workers=len(CHECKPOINT_FILES)) as pool:
        problem = _hash_problem(_start_hashes(Path(path), pool), scan.meta)
    return ("damaged", problem) if problem else ("ok", None)


def _start_hashes(path: Path, pool: ThreadPoolExecutor) -> dict[str, Future]:
    return {name: pool.submit(_sha256_file, path / name) for name in CHECKPOINT_FILES}


def _hash_problem(hashes: dict[str, Future], meta: dict) -> str | None:
    for name, future in hashes.items():
        try:
            digest = future.result()
        except OSError as exc:
            return f"{name}: {error_reason(exc)}"
        if digest != meta["files"][name].get("sha256"):
            return f"{name}: sha256 mismatch"
    return None


def _sha256_file(path: Path) -> str:
    sha = hashlib.sha256()
    buffer = bytearray(READ_CHUNK_BYTES)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            sha.update(view[:n])
    return sha.hexdigest()


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Verify (meta.json, files, sizes, sha256) and load a checkpoint dir onto the CPU.

    Files are hashed while they load: both loaders are pickle-free, so reading a corrupt
    file is safe, and its data is discarded if a hash does not match. Any problem raises
    CheckpointError naming the file.
    """
    path = Path(path)
    scan = scan_checkpoint(path)
    if scan.status != "ok":
        raise CheckpointError(f"checkpoint {path} is {scan.status}: {scan.problem}")
    load_error = None
    with ThreadPoolExecutor(max_workers=len(CHECKPOINT_FILES)) as pool:
        hashes = _start_hashes(path, pool)
        try:
            model_state = _load_model(path / MODEL_FILE, scan.header.get("__metadata__"))
            trainer_state = _load_trainer_state(path / STATE_FILE)
        except CheckpointError as exc:
            load_error = exc
        problem = _hash_problem(hashes, scan.meta)
    if problem:
        raise CheckpointError(f"checkpoint {path} is damaged: {problem}")
    if load_error is not None:
        raise load_error
    return Checkpoint(path, model_state, trainer_state, scan.meta)


def _load_model(path: Path, metadata: dict | None) -> dict[str, torch.Tensor]:
    metadata = metadata or {}
    if metadata.get("format") != SAFETENSORS_FORMAT:
        raise CheckpointError(f"{path}: not a {SAFETENSORS_FORMAT} file")
    try:
        aliases = json.loads(metadata.get("aliases") or "{}")
        tensors = load_file(str(path), device="cpu")
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{path}: cannot be read ({_first_line(exc)})") from exc
    if not isinstance(aliases, dict):
        raise CheckpointError(f"{path}: malformed aliases metadata")
    for alias, owner in aliases.items():
        if owner not in tensors:
            raise CheckpointError(f"{path}: alias {alias!r} points to missing {owner!r}")
        tensors[alias] = tensors[owner]
    return tensors


def _load_trainer_state(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            state = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad archive
        if "weights only" in str(exc).lower() or "weights_only" in str(exc):
            raise CheckpointError(
                f"{path}: refused to load: it holds objects other than plain data and tensors"
                " (checkpoints are loaded with weights_only=True, never unpickled)"
            ) from exc
        raise CheckpointError(f"{path}: cannot be read ({_first_line(exc)})") from exc
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, not a dict")
    return state


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def find_latest(root: str | os.PathLike, log: Callable[[str], None] | None = None) -> Path | None:
    """The newest usable checkpoint in ``root``, or None.

    Starts with the one latest.json points to (or, if latest.json is missing or unreadable,
    the highest step_* dir) and falls back to older ones while verification fails, reporting
    each skipped checkpoint through ``log`` (default: warnings.warn).
    """

    def verify(path: Path) -> tuple[Path | None, str]:
        status, problem = verify_checkpoint(path)
        return (path, "") if status == "ok" else (None, f"{status} ({problem})")

    return _newest_usable(Path(root), log or _warn, verify)


def load_latest(
    root: str | os.PathLike, log: Callable[[str], None] | None = None
) -> Checkpoint | None:
    """Load the newest usable checkpoint, like ``find_latest`` but reading each file once."""

    def load(path: Path) -> tuple[Checkpoint | None, str]:
        try:
            return load_checkpoint(path), ""
        except CheckpointError as exc:
            return None, f"unusable ({exc})"

    return _newest_usable(Path(root), log or _warn, load)


def _newest_usable(root: Path, log: Callable[[str], None], attempt: Callable) -> Any:
    """The first candidate, newest first, for which ``attempt`` succeeds; skips are logged."""
    try:
        pointer = read_latest(root)
    except CheckpointError as exc:
        log(f"{exc}; scanning step_* directories instead")
        pointer = None
    skipped: list[str] = []
    for path in _candidates(root, pointer):
        result, problem = attempt(path)
        if result is not None:
            for message in skipped:
                log(f"{message}; using {path.name}")
            return result
        skipped.append(f"checkpoint {path.name} is {problem}")
    for message in skipped:
        log(f"{message}; no usable checkpoint left in {root}")
    return None


def _candidates(root: Path, pointer: str | None) -> list[Path]:
    """Newest first: latest.json's target, then older step dirs."""
    newest_first = list(reversed(list_step_dirs(root)))
    if pointer is None:
        return newest_first
    step = parse_step(pointer)
    return [root / pointer] + [d for d in newest_first if parse_step(d.name) < step]


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)

"""Reading checkpoints: load without unpickling, and find the newest usable one.

Model weights load through safetensors, the trainer state through
``torch.load(weights_only=True)``; files are hashed while they load and a mismatch discards
the data (``verify_checkpoint``, the hash check alone, is stdlib and lives in ``layout``).
``find_latest`` / ``load_latest`` start at ``latest.json`` and fall back to older checkpoints
while verification fails, reporting each one skipped; ``load_latest`` refuses to mistake a
directory of unusable checkpoints for an empty one. ``load_weights`` / ``load_latest_weights``
read the model alone, for taking a model out of a run (``speedtronic.modelout``);
``load_init_weights`` finds them for ``--init-from``.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from speedtronic.checkpoint.helpers import Helpers
from speedtronic.checkpoint.layout import (
    CHECKPOINT_FILES,
    JSON_ERRORS,
    META_FILE,
    MODEL_FILE,
    SAFETENSORS_FORMAT,
    STATE_FILE,
    error_reason,
    hash_problem,
    list_step_dirs,
    meta_fields_problem,
    parse_step,
    read_latest,
    read_safetensors_header,
    scan_checkpoint,
    sha256_file,
    start_hashes,
    verify_checkpoint,
)
from speedtronic.errors import CheckpointError, ConfigError


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


class NoUsableCheckpointError(CheckpointError):
    """``root`` holds checkpoints but none of them is usable.

    A resume must stop here rather than start over: starting fresh is the user's call, and a
    fresh run's saves would replace the evidence. ``problems`` holds one line per checkpoint
    (the CLI prints each); ``skipped`` the reasons alone.
    """

    def __init__(self, root: Path, skipped: list[str], hint: str | None = None):
        head = f"no usable checkpoint in {root}: all {len(skipped)} found are damaged or incomplete"
        super().__init__(f"{head}: {'; '.join(skipped)}", hint)
        self.root, self.skipped = root, skipped
        self.problems = [head, *(f"  {line}" for line in skipped)]


class _Unusable(Exception):
    """Why one checkpoint cannot be used; load_checkpoint turns it into a CheckpointError."""

    def __init__(self, status: str, problem: str):
        super().__init__(problem)
        self.status, self.problem = status, problem


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Verify (meta.json, files, sizes, sha256) and load a checkpoint dir onto the CPU.

    Any problem raises CheckpointError naming the checkpoint, the file and what is wrong.
    """
    path = Path(path)
    try:
        return _read_checkpoint(path)
    except _Unusable as exc:
        raise CheckpointError(f"checkpoint {path} is {exc.status}: {exc.problem}") from None


def _read_checkpoint(path: Path) -> Checkpoint:
    """``load_checkpoint`` without the path in its errors: raises _Unusable.

    Files are hashed while they load: both loaders are pickle-free, so reading a corrupt file
    is safe, and its data is discarded if a hash does not match.
    """
    scan = scan_checkpoint(path)
    if scan.status != "ok":
        raise _Unusable(scan.status, scan.problem)
    load_error = None
    with Helpers(len(CHECKPOINT_FILES) + 1) as pool:
        hashes = start_hashes(path, pool, scan.meta)
        try:
            model_state = _load_model(path / MODEL_FILE, scan.header.get("__metadata__"))
            trainer_state = _load_trainer_state(path / STATE_FILE)
        except _Unusable as exc:
            load_error = exc
        problem = hash_problem(hashes, scan.meta)
    if problem:  # a hash mismatch explains a load error, so it is reported first
        raise _Unusable("damaged", problem)
    if load_error is not None:
        raise load_error
    return Checkpoint(path, model_state, trainer_state, scan.meta)


def load_weights(path: str | os.PathLike) -> Checkpoint:
    """The model weights and meta.json of one checkpoint dir, for reading a model out of a run.

    Needs only ``model.safetensors`` and ``meta.json`` (a DumbDiLoCo run's final global may
    have no trainer state): the weights are checked against the size and sha256 meta.json
    records for them, when it records them, while they load. ``trainer_state`` is ``{}``. Any
    problem is a CheckpointError naming the checkpoint and the file.
    """
    path = Path(path)
    try:
        return _read_weights(path)
    except _Unusable as exc:
        raise CheckpointError(f"checkpoint {path} is {exc.status}: {exc.problem}") from None


def _read_weights(path: Path) -> Checkpoint:
    try:
        meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
        header = read_safetensors_header(path / MODEL_FILE)
    except FileNotFoundError as exc:
        raise _Unusable("incomplete", f"{Path(exc.filename).name} missing") from None
    except (OSError, *JSON_ERRORS) as exc:
        raise _Unusable("damaged", error_reason(exc)) from None
    if not isinstance(meta, dict):
        raise _Unusable("damaged", f"{META_FILE}: not a JSON object")
    problem = meta_fields_problem(meta)
    if problem:
        raise _Unusable("damaged", f"{META_FILE}: {problem}")
    files = meta.get("files")
    record = files.get(MODEL_FILE) if isinstance(files, dict) else None
    metadata = dict(header.get("__metadata__") or {})
    if metadata.get("format") != SAFETENSORS_FORMAT:
        metadata = {"format": SAFETENSORS_FORMAT}  # plain safetensors: no aliases to restore
    with Helpers(1) as pool:
        digest = pool.submit(sha256_file, path / MODEL_FILE) if record else None
        model_state = _load_model(path / MODEL_FILE, metadata)
        if digest is not None and digest.result() != record.get("sha256"):
            raise _Unusable("damaged", f"{MODEL_FILE}: sha256 mismatch")
    return Checkpoint(path, model_state, {}, meta)


def load_latest_weights(
    root: str | os.PathLike, log: Callable[[str], None] | None = None
) -> Checkpoint | None:
    """The weights of the newest usable checkpoint in ``root``, as ``load_latest`` picks it
    (the newest one whose structure is whole; damaged ones are skipped and reported), reading
    only the model file. None when ``root`` holds no checkpoint; NoUsableCheckpointError when
    it holds some and none is usable."""

    def load(path: Path) -> tuple[Checkpoint | None, str]:
        scan = scan_checkpoint(path)
        if scan.status != "ok":
            return None, f"{scan.status} ({scan.problem})"
        try:
            return _read_weights(path), ""
        except _Unusable as exc:
            return None, f"{exc.status} ({exc.problem})"

    found, skipped = _newest_usable(Path(root), log or _warn, load)
    if found is None and skipped:
        raise NoUsableCheckpointError(Path(root), skipped)
    return found


def _load_model(path: Path, metadata: dict | None) -> dict[str, torch.Tensor]:
    metadata = metadata or {}
    if metadata.get("format") != SAFETENSORS_FORMAT:
        raise _Unusable("damaged", f"{MODEL_FILE}: not a {SAFETENSORS_FORMAT} file")
    try:
        aliases = json.loads(metadata.get("aliases") or "{}")
        tensors = load_file(str(path), device="cpu")
    except Exception as exc:  # safetensors raises its own error types; json a RecursionError
        raise _Unusable("damaged", f"{MODEL_FILE}: cannot be read ({_first_line(exc)})") from exc
    names_ok = isinstance(aliases, dict) and all(isinstance(v, str) for v in aliases.values())
    if not names_ok:
        raise _Unusable("damaged", f"{MODEL_FILE}: aliases metadata is not a map of names")
    for alias, owner in aliases.items():
        if owner not in tensors:
            raise _Unusable("damaged", f"{MODEL_FILE}: alias {alias!r} points to missing {owner!r}")
        tensors[alias] = tensors[owner]
    return tensors


def load_init_weights(
    path: str | os.PathLike, log: Callable[[str], None] | None = None
) -> Checkpoint:
    """The model weights of a checkpoint, for a new run that starts from them (``--init-from``).

    ``path`` is a run's output directory, its ``checkpoints/`` directory (the newest usable
    checkpoint, as resume picks it) or one checkpoint directory (a ``step_*`` one, or a
    DumbDiLoCo run's ``final_global/``). The weights are verified as they load; the trainer
    state is not read (the new run starts its own).
    """
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(
            f"checkpoint.init_from: {path} is not a directory (a run's output "
            "directory, its checkpoints/ directory or a step_* directory; or a transformers "
            "model: its directory, or hf://OWNER/NAME[@REV])"
        )
    try:
        if (path / META_FILE).is_file():
            return load_weights(path)
        root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        found = load_latest_weights(root, log)
    except CheckpointError as exc:
        raise CheckpointError(f"checkpoint.init_from: {exc}") from None
    if found is None:
        raise ConfigError(f"checkpoint.init_from: no usable checkpoint in {path}")
    return found


def _load_trainer_state(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            state = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad archive
        if "weights only" in str(exc).lower() or "weights_only" in str(exc):
            raise _Unusable(
                "damaged",
                f"{STATE_FILE}: refused to load: it holds objects other than plain data and"
                " tensors (checkpoints are loaded with weights_only=True, never unpickled)",
            ) from exc
        raise _Unusable("damaged", f"{STATE_FILE}: cannot be read ({_first_line(exc)})") from exc
    if not isinstance(state, dict):
        raise _Unusable("damaged", f"{STATE_FILE}: holds a {type(state).__name__}, not a dict")
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
    log = log or _warn

    def verify(path: Path) -> tuple[Path | None, str]:
        status, problem = verify_checkpoint(path)
        return (path, "") if status == "ok" else (None, f"{status} ({problem})")

    found, skipped = _newest_usable(Path(root), log, verify)
    for message in skipped if found is None else []:
        log(f"{message}; no usable checkpoint left in {root}")
    return found


def load_latest(
    root: str | os.PathLike,
    log: Callable[[str], None] | None = None,
    validate: Callable[[Checkpoint], str | None] | None = None,
) -> Checkpoint | None:
    """Load the newest usable checkpoint, like ``find_latest`` but reading each file once.

    ``validate`` may return a problem with a loaded checkpoint (e.g. a trainer state of the
    wrong shape), which then counts as damaged, like a hash mismatch. Returns None only when
    ``root`` holds no checkpoint; raises NoUsableCheckpointError, listing each one and why,
    when it holds some but none is usable.
    """

    def load(path: Path) -> tuple[Checkpoint | None, str]:
        try:
            checkpoint = _read_checkpoint(path)
        except _Unusable as exc:
            return None, f"{exc.status} ({exc.problem})"
        problem = validate(checkpoint) if validate is not None else None
        return (None, f"damaged ({problem})") if problem else (checkpoint, "")

    found, skipped = _newest_usable(Path(root), log or _warn, load)
    if found is None and skipped:
        raise NoUsableCheckpointError(Path(root), skipped)
    return found


def _newest_usable(root: Path, log: Callable[[str], None], attempt: Callable) -> tuple[Any, list]:
    """``(result, skipped)``: the first candidate, newest first, for which ``attempt`` works.

    Skips before a success are logged here; if nothing works, ``skipped`` says why for each
    candidate and the caller decides whether that is a warning or an error.
    """
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
            return result, skipped
        skipped.append(f"checkpoint {path.name} is {problem}")
    return None, skipped


def _candidates(root: Path, pointer: str | None) -> list[Path]:
    """Newest first: latest.json's target, then older step dirs."""
    newest_first = list(reversed(list_step_dirs(root)))
    if pointer is None:
        return newest_first
    step = parse_step(pointer)
    return [root / pointer] + [d for d in newest_first if parse_step(d.name) < step]


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)

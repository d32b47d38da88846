"""The on-disk layout of checkpoints and its cheap structural check. Stdlib only.

This module owns the names of the layout (``latest.json``, ``step_XXXXXXXXXX`` dirs,
``.tmp-*`` dirs, the three files inside a checkpoint), listing them, reading ``latest.json``
and a safetensors header without torch, and ``scan_checkpoint``: meta.json parses, files exist
with the recorded sizes, the safetensors header parses and covers its file. It must never
import torch or safetensors, so that ``speedtronic ckpt`` is instant and works without torch.
Hashing and tensor loading build on it in ``speedtronic.checkpoint.load``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

from speedtronic.errors import CheckpointError

MODEL_FILE = "model.safetensors"
STATE_FILE = "trainer_state.pt"
META_FILE = "meta.json"
LATEST_FILE = "latest.json"
CHECKPOINT_FILES = (MODEL_FILE, STATE_FILE)
FORMAT_VERSION = 1
STEP_PREFIX = "step_"
TMP_PREFIX = ".tmp-"

SAFETENSORS_FORMAT = "speedtronic-ckpt-1"
READ_CHUNK_BYTES = 8 << 20

_STEP_RE = re.compile(r"^step_(\d{10,})$")
# .tmp-step_0000000100-<pid>, optionally with a suffix for dirs being replaced or deleted.
_TMP_RE = re.compile(r"^\.tmp-step_(\d{10,})-(\d+)(?:-[a-z]+)?$")
# A header larger than this is certainly not ours; refuse to read it into memory.
_MAX_HEADER_BYTES = 100 << 20


def step_dir_name(step: int) -> str:
    """``step_0000000100``: 10-digit zero padding keeps names sorting like steps."""
    return f"{STEP_PREFIX}{int(step):010d}"


def parse_step(name: str) -> int | None:
    """The step of a ``step_*`` or ``.tmp-step_*`` dir name; None for anything else."""
    match = _STEP_RE.match(name) or _TMP_RE.match(name)
    return int(match.group(1)) if match else None


def parse_tmp_pid(name: str) -> int | None:
    """The pid that owns a ``.tmp-step_*-<pid>`` dir; None if the name is not one."""
    match = _TMP_RE.match(name)
    return int(match.group(2)) if match else None


def list_step_dirs(root: str | os.PathLike) -> list[Path]:
    """All ``step_*`` dirs in ``root`` sorted by step, complete or not (no verification)."""
    try:
        entries = list(os.scandir(root))
    except OSError:  # missing, or not a directory: no checkpoints there
        return []
    dirs = [Path(e.path) for e in entries if _STEP_RE.match(e.name) and e.is_dir()]
    return sorted(dirs, key=lambda p: parse_step(p.name))


def list_tmp_dirs(root: str | os.PathLike) -> list[Path]:
    """``.tmp-*`` dirs in ``root``: writes in progress or left behind by a crash."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    return sorted(Path(e.path) for e in entries if e.name.startswith(TMP_PREFIX) and e.is_dir())


def read_latest(root: str | os.PathLike) -> str | None:
    """The dir name latest.json points to; None if there is no latest.json.

    Raises CheckpointError if latest.json exists but cannot be trusted (unreadable, not our
    format, or pointing outside ``root``).
    """
    path = Path(root) / LATEST_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is unreadable: {error_reason(exc)}") from exc
    name = data.get("path") if isinstance(data, dict) else None
    # Only a bare step dir name is accepted: latest.json must not point anywhere else.
    if not isinstance(name, str) or not _STEP_RE.match(name):
        raise CheckpointError(f"{path} does not name a step_* directory")
    return name


def read_safetensors_header(path: str | os.PathLike) -> dict:
    """Parse a safetensors header without touching tensor data.

    Layout: 8-byte little-endian header length, JSON header, then the tensor bytes. Raises
    FileNotFoundError if missing and ValueError if the header is malformed or does not
    describe exactly the bytes in the file (which is how truncation shows up).
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        prefix = f.read(8)
        if len(prefix) < 8:
            raise ValueError(f"{size} bytes is too short for a safetensors header")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(size - 8, _MAX_HEADER_BYTES):
            raise ValueError(f"header length {length} does not fit in a {size}-byte file")
        try:
            header = json.loads(f.read(length))
        except ValueError as exc:
            raise ValueError("header is not valid JSON") from exc
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    end = 0
    for key, entry in header.items():
        if key != "__metadata__":
            end = max(end, _checked_entry(key, entry))
    if 8 + length + end != size:
        raise ValueError(f"header describes {8 + length + end} bytes but the file has {size}")
    return header


def _checked_entry(key: str, entry: object) -> int:
    """Validate one tensor entry of a header; returns where its data ends."""
    ok = isinstance(entry, dict) and isinstance(entry.get("dtype"), str)
    shape = entry.get("shape") if ok else None
    offsets = entry.get("data_offsets") if ok else None
    ok = ok and isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)
    ok = ok and isinstance(offsets, list) and len(offsets) == 2
    ok = ok and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1]
    if not ok:
        raise ValueError(f"header entry {key!r} is malformed")
    return offsets[1]


@dataclass
class Problem:
    """One thing wrong with a checkpoint; ``status`` is "incomplete" or "damaged"."""

    status: str
    message: str


@dataclass
class CheckpointScan:
    """Result of the cheap structural check of one checkpoint dir (no hashing)."""

    path: Path
    meta: dict | None = None
    header: dict | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def status(self) -> str:
        """One of ok, incomplete, damaged; incomplete wins, as a crashed write explains both."""
        kinds = {p.status for p in self.problems}
        return "incomplete" if "incomplete" in kinds else "damaged" if kinds else "ok"

    @property
    def problem(self) -> str | None:
        for p in self.problems:
            if p.status == self.status:
                return p.message
        return None


def scan_checkpoint(path: str | os.PathLike) -> CheckpointScan:
    """Structural check of a checkpoint dir: cheap enough to run on every dir of a run.

    Catches missing files, truncation (size differs from meta, header does not cover the
    file) and unparseable metadata. It does not hash: ``checkpoint.verify_checkpoint`` adds
    the sha256 comparison that catches same-size corruption.
    """
    scan = CheckpointScan(Path(path))
    if not scan.path.is_dir():
        scan.problems.append(Problem("incomplete", "directory missing"))
        return scan
    if scan.path.name.startswith(TMP_PREFIX):
        scan.problems.append(Problem("incomplete", "unfinished write (temporary directory)"))
    scan.meta = _read_meta(scan.path, scan.problems)
    try:
        scan.header = read_safetensors_header(scan.path / MODEL_FILE)
    except FileNotFoundError:
        scan.problems.append(Problem("incomplete", f"{MODEL_FILE} missing"))
    except (OSError, ValueError) as exc:
        scan.problems.append(Problem("damaged", f"{MODEL_FILE}: {error_reason(exc)}"))
    if scan.meta is not None:
        scan.problems.extend(_check_file_sizes(scan.path, scan.meta))
    return scan


def _read_meta(path: Path, problems: list[Problem]) -> dict | None:
    try:
        meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(Problem("incomplete", f"{META_FILE} missing"))
        return None
    except (OSError, ValueError) as exc:
        problems.append(Problem("damaged", f"{META_FILE}: {error_reason(exc)}"))
        return None
    if not isinstance(meta, dict) or not isinstance(meta.get("files"), dict):
        problems.append(Problem("damaged", f"{META_FILE}: no file list"))
        return None
    if meta.get("format_version") != FORMAT_VERSION:
        version = meta.get("format_version")
        problems.append(Problem("damaged", f"{META_FILE}: unsupported format_version {version}"))
    return meta


def _check_file_sizes(path: Path, meta: dict) -> list[Problem]:
    problems = []
    for name in CHECKPOINT_FILES:
        record = meta["files"].get(name)
        if not isinstance(record, dict) or not isinstance(record.get("bytes"), int):
            problems.append(Problem("damaged", f"{META_FILE}: no record of {name}"))
            continue
        try:
            size = (path / name).stat().st_size
        except FileNotFoundError:
            problems.append(Problem("incomplete", f"{name} missing"))
            continue
        if size != record["bytes"]:
            message = f"{name}: {size} bytes on disk, {record['bytes']} recorded"
            problems.append(Problem("damaged", message))
    return problems


def remove_checkpoint_dir(path: Path) -> None:
    """Delete a checkpoint dir by first renaming it to a ``.tmp-*`` name.

    The rename is atomic, so a crash halfway through the delete leaves a dir that every
    reader already ignores and the next save cleans up, never a half-deleted ``step_*``.
    """
    if not path.exists():
        return
    doomed = path.with_name(f"{TMP_PREFIX}{path.name}-{os.getpid()}-del")
    os.rename(path, doomed)
    shutil.rmtree(doomed)


def error_reason(exc: BaseException) -> str:
    """The OS reason alone ("No space left on device"), without errno and path noise."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__

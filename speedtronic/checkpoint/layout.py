"""The on-disk layout of checkpoints and its cheap structural check. Stdlib only.

This module owns the names of the layout (``latest.json``, ``step_XXXXXXXXXX`` dirs,
``.tmp-*`` dirs, the three files inside a checkpoint), listing them, reading ``latest.json``
and a safetensors header without torch, ``scan_checkpoint``: meta.json parses and has the
right shape, files exist with the recorded sizes (the two data files, and the run's
``tokenizer.json`` where meta.json lists one), the safetensors header parses and covers its
file, and ``verify_checkpoint``, which adds the sha256 of every recorded file. It must never import
torch or safetensors, so that ``speedtronic ckpt`` is instant and works without torch. Tensor
loading builds on it in ``speedtronic.checkpoint.load``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from speedtronic.checkpoint.helpers import Helpers
from speedtronic.errors import CheckpointError

MODEL_FILE = "model.safetensors"
STATE_FILE = "trainer_state.pt"
META_FILE = "meta.json"
LATEST_FILE = "latest.json"
CHECKPOINT_FILES = (MODEL_FILE, STATE_FILE)
# The run's tokenizer, when it is a tokenizers file (checkpoint.tokenizer): optional, and like
# the two data files listed with its size and sha256 in meta.json's "files" when present.
TOKENIZER_FILE = "tokenizer.json"
EXTRA_FILES = (TOKENIZER_FILE,)
FORMAT_VERSION = 1
STEP_PREFIX = "step_"
TMP_PREFIX = ".tmp-"

SAFETENSORS_FORMAT = "speedtronic-ckpt-1"
READ_CHUNK_BYTES = 8 << 20

_STEP_RE = re.compile(r"^step_(\d{10,})$")
# .tmp-step_0000000100-<pid>, optionally with a suffix for dirs being replaced or deleted.
_TMP_RE = re.compile(r"^\.tmp-step_(\d{10,})-(\d+)(?:-[a-z]+)?$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# A header larger than this is certainly not ours; refuse to read it into memory.
_MAX_HEADER_BYTES = 100 << 20
# Errors json.loads raises for text it cannot turn into objects: bad syntax, bad UTF-8, and
# nesting deeper than the interpreter's recursion limit (a hostile or garbled file).
JSON_ERRORS = (ValueError, RecursionError)


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
    except (OSError, *JSON_ERRORS) as exc:
        raise CheckpointError(f"{path} is unreadable: {error_reason(exc)}") from exc
    name = data.get("path") if isinstance(data, dict) else None
    # Only a bare step dir name is accepted: latest.json must not point anywhere else.
    if not isinstance(name, str) or not _STEP_RE.match(name):
        raise CheckpointError(f"{path} does not name a step_* directory")
    # write_latest records both; a step that disagrees with the name means a hand-made file.
    if not _is_count(data.get("step")) or data["step"] != parse_step(name):
        raise CheckpointError(f"{path}: step must be the integer step of {name}")
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
        except JSON_ERRORS as exc:
            raise ValueError("header is not valid JSON") from exc
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    metadata = header.get("__metadata__", {})
    # The format says str -> str; readers (ours and safetensors) rely on it.
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("header __metadata__ is not a map of strings")
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
    """meta.json if it parses and has the shape readers rely on; otherwise a problem and None.

    A wrong shape is returned as None, not as a dict, so that no reader (inspect's table,
    retention, resume) ever formats or compares a field of the wrong type.
    """
    try:
        meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(Problem("incomplete", f"{META_FILE} missing"))
        return None
    except (OSError, *JSON_ERRORS) as exc:
        problems.append(Problem("damaged", f"{META_FILE}: {error_reason(exc)}"))
        return None
    if not isinstance(meta, dict) or not isinstance(meta.get("files"), dict):
        problems.append(Problem("damaged", f"{META_FILE}: no file list"))
        return None
    if meta.get("format_version") != FORMAT_VERSION:
        version = meta.get("format_version")
        problems.append(Problem("damaged", f"{META_FILE}: unsupported format_version {version}"))
        return None
    shape_problem = meta_fields_problem(meta) or _files_problem(meta["files"])
    if shape_problem:
        problems.append(Problem("damaged", f"{META_FILE}: {shape_problem}"))
        return None
    return meta


def _is_count(value: object) -> bool:
    # bool is an int subclass, but true/false in a count field means a garbled file.
    return type(value) is int and value >= 0


def _is_number(value: object) -> bool:
    return type(value) in (int, float)


def _or_null(test):
    return lambda value: value is None or test(value)


# meta.json fields that readers use -> (rule, test). "files" has its own check, _files_problem.
_META_FIELDS = {
    "step": ("an integer >= 0", _is_count),
    "run_id": ("a string", lambda value: isinstance(value, str)),
    "tokens": ("an integer >= 0 or null", _or_null(_is_count)),
    "samples": ("an integer >= 0 or null", _or_null(_is_count)),
    "param_count": ("an integer >= 0 or null", _or_null(_is_count)),
    "loss": ("a number or null", _or_null(_is_number)),
    "created_at": ("a string or null", _or_null(lambda value: isinstance(value, str))),
    "config": ("an object or null", _or_null(lambda value: isinstance(value, dict))),
    "tokenizer": ("an object or null", _or_null(lambda value: isinstance(value, dict))),
}
_REQUIRED_META = ("step", "run_id")


def meta_fields_problem(meta: dict) -> str | None:
    """The first field of meta.json with the wrong type, as "'key' must be rule (got x)".

    Covers the fields readers use, not "files"; saving runs it too, so that no checkpoint is
    written that readers would call damaged.
    """
    for key, (rule, ok) in _META_FIELDS.items():
        if key not in meta and key in _REQUIRED_META:
            return f"{key!r} missing"
        if not ok(meta.get(key)):
            return f"{key!r} must be {rule} (got {_short(meta[key])})"
    return None


def recorded_files(meta: dict) -> tuple[str, ...]:
    """The files a checkpoint holds by its meta.json: both data files, and the extras it lists."""
    files = meta.get("files") if isinstance(meta.get("files"), dict) else {}
    return CHECKPOINT_FILES + tuple(name for name in EXTRA_FILES if name in files)


def _files_problem(files: dict) -> str | None:
    for name in recorded_files({"files": files}):
        problem = _file_record_problem(files.get(name))
        if problem:
            return f"files[{name!r}] {problem}"
    return None


def _file_record_problem(record: object) -> str | None:
    if record is None:
        return "missing"
    if not isinstance(record, dict):
        return f"must be an object (got {_short(record)})"
    if not _is_count(record.get("bytes")):
        return f"bytes must be an integer >= 0 (got {_short(record.get('bytes'))})"
    sha = record.get("sha256")
    if not isinstance(sha, str) or not _SHA256_RE.match(sha):
        return f"sha256 must be 64 lowercase hex digits (got {_short(sha)})"
    return None


def _short(value: object) -> str:
    """A bad value for a message: scalars as JSON, containers and objects by type name."""
    if not isinstance(value, (str, int, float, type(None))):
        return type(value).__name__
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_file_sizes(path: Path, meta: dict) -> list[Problem]:
    problems = []
    for name in recorded_files(meta):
        record = meta["files"][name]  # shape already checked by _read_meta
        try:
            size = (path / name).stat().st_size
        except FileNotFoundError:
            problems.append(Problem("incomplete", f"{name} missing"))
            continue
        if size != record["bytes"]:
            message = f"{name}: {size} bytes on disk, {record['bytes']} recorded"
            problems.append(Problem("damaged", message))
    return problems


def verify_checkpoint(path: str | os.PathLike) -> tuple[str, str | None]:
    """``(status, problem)``: the structural check plus the sha256 of every recorded file.

    status is "ok", "incomplete" or "damaged"; problem names the file and what is wrong.
    Stdlib only, so ``ckpt inspect --verify`` can hash without importing torch.
    """
    scan = scan_checkpoint(path)
    if scan.status != "ok":
        return scan.status, scan.problem
    problem = verify_hashes(scan)
    return ("damaged", problem) if problem else ("ok", None)


def verify_hashes(scan: CheckpointScan) -> str | None:
    """sha256 of the files of a checkpoint that scanned ok: the first mismatch, or None."""
    with Helpers(len(recorded_files(scan.meta))) as pool:
        return hash_problem(start_hashes(scan.path, pool, scan.meta), scan.meta)


def start_hashes(path: Path, pool: Helpers, meta: dict) -> dict[str, Future]:
    """sha256 of the files meta.json records on ``pool``, so a loader can read them meanwhile."""
    return {name: pool.submit(sha256_file, path / name) for name in recorded_files(meta)}


def hash_problem(hashes: dict[str, Future], meta: dict) -> str | None:
    """The first file whose hash is not the one meta.json records; None if all match."""
    for name, future in hashes.items():
        try:
            digest = future.result()
        except OSError as exc:
            return f"{name}: {error_reason(exc)}"
        if digest != meta["files"][name].get("sha256"):
            return f"{name}: sha256 mismatch"
    return None


def sha256_file(path: Path) -> str:
    sha = hashlib.sha256()
    buffer = bytearray(READ_CHUNK_BYTES)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            sha.update(view[:n])
    return sha.hexdigest()


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
    if isinstance(exc, RecursionError):  # only JSON parsing recurses here
        return "JSON nested too deeply to parse"
    return str(exc) or type(exc).__name__

"""Writing checkpoints: crash-safe saves, hashing while writing, and retention.

A checkpoint is a directory ``<root>/step_XXXXXXXXXX/`` holding ``model.safetensors`` (the
model state_dict, tied tensors stored once), ``trainer_state.pt`` (an opaque dict of plain data
and tensors, later loaded only with ``torch.load(weights_only=True)``) and ``meta.json``
(written last: step, counters, versions, the redacted config, and the size and sha256 of both
files). Everything is written and fsynced in a ``.tmp-*`` sibling, renamed into place, then
``<root>/latest.json`` is replaced atomically. ``trainer_state`` belongs to its producers, one
key each (the trainer's "optimizer", "rng", "data"; a plug-in's); this module never looks inside.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import math
import operator
import os
import platform
import shutil
import struct
import sys
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import Future
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from speedtronic.checkpoint.files import (
    fsync_dir,
    fsync_file,
    install_dir,
    write_json,
    write_latest,
    write_small_files,
)
from speedtronic.checkpoint.helpers import Helpers
from speedtronic.checkpoint.layout import (
    EXTRA_FILES,
    FORMAT_VERSION,
    META_FILE,
    MODEL_FILE,
    SAFETENSORS_FORMAT,
    STATE_FILE,
    TMP_PREFIX,
    error_reason,
    list_step_dirs,
    list_tmp_dirs,
    meta_fields_problem,
    parse_tmp_pid,
    remove_checkpoint_dir,
    scan_checkpoint,
    step_dir_name,
)
from speedtronic.checkpoint.tail_hash import Sink, TailHasher
from speedtronic.errors import CheckpointError

# torch dtype -> safetensors dtype code, for the dtypes safetensors can load back into torch.
_ST_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
for _name, _code in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, _name):  # absent from older torch builds
        _ST_DTYPES[getattr(torch, _name)] = _code
# What torch.load(weights_only=True) rebuilds on every supported torch version.
_PLAIN_LEAVES = (str, bytes, int, float, bool, type(None), torch.dtype, torch.device, torch.Size)


def save_checkpoint(
    root: str | os.PathLike,
    step: int,
    model_state: Mapping[str, torch.Tensor],
    trainer_state: dict[str, Any],
    meta: dict[str, Any],
    keep_last: int | None = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> Path:
    """Write ``<root>/step_XXXXXXXXXX`` crash-safely, point latest.json at it, apply retention.

    ``meta`` comes from the caller with at least ``run_id`` (and normally tokens, samples, loss,
    param_count and the redacted config); format_version, step, created_at, versions and files
    are added here. ``trainer_state`` is opaque (see the module docstring) but must hold only
    plain data and tensors, because it is loaded with ``weights_only=True``; anything else is
    refused now rather than discovered at resume, and so is a meta field of the wrong type.
    ``keep_last=N`` keeps the newest N complete checkpoints of this run_id and deletes only
    its older complete ones (never the one just written, never a damaged or incomplete one,
    never other runs'). ``extra_files`` (``layout.EXTRA_FILES``: the run's ``tokenizer.json``)
    are written beside the weights and listed in meta.json's "files" like them. On an OSError
    the temporary dir is removed, earlier checkpoints and latest.json are untouched, and a
    CheckpointError names the root and the OS reason.
    """
    extras = dict(extra_files or {})
    _check_arguments(step, trainer_state, meta, keep_last, extras)
    full_meta = _full_meta(step, meta)
    # Refuse now what every reader would later call a damaged checkpoint.
    problem = meta_fields_problem(full_meta)
    if problem:
        raise CheckpointError(f"checkpoint meta: {problem}")
    root, name = Path(root), step_dir_name(step)
    tensors, aliases = _dedupe_model_state(model_state)
    tmp = root / f"{TMP_PREFIX}{name}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # ours, from an earlier failed attempt
        tmp.mkdir()
        _write_dir(tmp, tensors, aliases, trainer_state, full_meta, extras)
        final = install_dir(tmp, root / name)
        write_latest(root, step, name)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            reason = error_reason(exc)
            raise CheckpointError(f"could not write checkpoint to {root}: {reason}") from exc
        raise
    _clean_up(root, name, meta["run_id"], keep_last)
    return final


def _check_arguments(step: Any, trainer_state: Any, meta: Any, keep_last: Any, extras) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"step must be an integer >= 0, got {step!r}")
    if sys.byteorder != "little":
        raise CheckpointError("checkpoints can only be written on little-endian machines")
    if not isinstance(meta, dict) or not isinstance(meta.get("run_id"), str):
        raise CheckpointError("checkpoint meta must be a dict with at least a run_id string")
    if keep_last is not None and (isinstance(keep_last, bool) or int(keep_last) < 1):
        raise CheckpointError(f"keep_last must be >= 1 or None, got {keep_last!r}")
    if not isinstance(trainer_state, dict):
        raise CheckpointError(f"trainer_state must be a dict, got {type(trainer_state).__name__}")
    _check_plain(trainer_state, "trainer_state")
    if set(extras) - set(EXTRA_FILES) or not all(type(d) is bytes for d in extras.values()):
        raise CheckpointError(f"extra_files: only {', '.join(EXTRA_FILES)}, as bytes")


def _check_plain(obj: Any, where: str) -> None:
    """Refuse what weights_only loading would refuse, naming where it sits."""
    if isinstance(obj, torch.Tensor) or type(obj) in _PLAIN_LEAVES:
        return
    if type(obj) in (dict, OrderedDict):
        for key, value in obj.items():
            _check_plain(key, f"{where} key {key!r}")
            _check_plain(value, f"{where}[{key!r}]")
        return
    if type(obj) in (list, tuple):
        for index, value in enumerate(obj):
            _check_plain(value, f"{where}[{index}]")
        return
    kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
    raise CheckpointError(
        f"{where} is a {kind}: trainer state may hold only plain data and tensors",
        hint="store a state_dict() or .tolist() instead; checkpoints load with weights_only=True",
    )


def _dedupe_model_state(
    model_state: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """CPU, contiguous tensors with each shared tensor (tied weights) kept once.

    Returns ``(tensors, aliases)`` where ``aliases`` maps a dropped key to the key that holds
    the same tensor; ``load_checkpoint`` restores them so strict loading works. Identity is
    checked on the original device, before copies to CPU would make tied tensors look distinct.
    """
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    owners: dict[tuple, str] = {}
    for key, value in model_state.items():
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"model_state[{key!r}] is a {type(value).__name__}, not a tensor")
        if key == "__metadata__" or value.dtype not in _ST_DTYPES:
            raise CheckpointError(f"model_state[{key!r}] ({value.dtype}) cannot be stored")
        value = value.detach()
        identity = _storage_identity(value)
        if identity is not None and identity in owners:
            aliases[key] = owners[identity]
            continue
        if identity is not None:
            owners[identity] = key
        tensors[key] = value.to("cpu").contiguous()
    return tensors, aliases


def _storage_identity(t: torch.Tensor) -> tuple | None:
    if t.numel() == 0 or t.layout != torch.strided or t.device.type == "meta":
        return None
    ptr = t.untyped_storage().data_ptr()
    return (str(t.device), ptr, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def _write_dir(
    tmp: Path,
    tensors: dict[str, torch.Tensor],
    aliases: dict[str, str],
    trainer_state: dict,
    meta: dict,
    extras: dict[str, bytes],
) -> None:
    """Write the data files and the extras, then meta.json (last, with their sizes and hashes).

    Hashing runs on helper threads (sha256 and file I/O both drop the GIL), and so do the
    data fsyncs (this thread where none can start: ``Helpers``). All three files and the dir
    are fsynced before this returns, i.e. before anything is renamed.
    """
    st_meta = {"format": SAFETENSORS_FORMAT, "aliases": json.dumps(aliases, sort_keys=True)}
    model_path, state_path = tmp / MODEL_FILE, tmp / STATE_FILE
    with Helpers(4) as pool:
        # Trainer state first: its hash (read back behind torch.save) is the longest chain;
        # the model's hash works from memory and can run any time.
        state_bytes, state_sha = _write_torch(state_path, trainer_state, pool)
        synced = [pool.submit(fsync_file, state_path)]
        model_bytes, model_sha = _write_safetensors(model_path, tensors, st_meta, pool)
        synced.append(pool.submit(fsync_file, model_path))
        meta["files"] = {
            MODEL_FILE: {"bytes": model_bytes, "sha256": model_sha.result()},
            STATE_FILE: {"bytes": state_bytes, "sha256": state_sha.result()},
        }
        meta["files"].update(write_small_files(tmp, extras))
        write_json(tmp / META_FILE, meta)
        for future in synced:
            future.result()
    fsync_dir(tmp)


def _write_safetensors(
    path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str], pool
) -> tuple[int, Future]:
    """Stream a safetensors file straight from tensor memory; returns (size, sha256 future).

    Written here rather than with ``safetensors.torch.save_file`` so that the hash is taken
    from the same in-memory bytes on another thread while this one writes, with no extra copy;
    ``safetensors.torch.load_file`` reads the result (the format is an 8-byte header length,
    a JSON header, then raw little-endian tensor bytes).
    """
    # Larger elements first: every tensor then starts at a multiple of its element size.
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for key in order:
        t = tensors[key]
        end = offset + t.numel() * t.element_size()
        header[key] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape)}
        header[key]["data_offsets"] = [offset, end]
        offset = end
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # tensor data starts 8-byte aligned, as safetensors does
    views = [memoryview(struct.pack("<Q", len(blob)) + blob)]
    views += [_byte_view(tensors[key]) for key in order]
    # The views borrow tensor memory: pass the tensors along to keep them alive while hashing.
    digest = pool.submit(_sha256_views, views, tensors)
    with open(path, "wb") as f:
        for view in views:
            f.write(view)
    return sum(len(v) for v in views), digest


def _byte_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without copying them."""
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B")


def _sha256_views(views: list[memoryview], _keepalive: object) -> str:
    sha = hashlib.sha256()
    for view in views:
        sha.update(view)
    return sha.hexdigest()


def _write_torch(path: Path, obj: dict, pool: Helpers) -> tuple[int, Future]:
    """torch.save ``obj`` to ``path``; returns (size, sha256 future).

    torch.save hands its writer memoryviews valid only during ``write()``: hashing them
    inline would add the whole hash time to the save, and handing them to a thread would
    need a copy. Instead a helper thread reads the file back behind the writer (from the
    page cache) and hashes it, concurrently and in bounded memory, so that with a spare core
    the hash costs little wall time.
    """
    with open(path, "wb", buffering=0) as f:
        hasher = TailHasher(path, pool)
        sink = Sink(f, hasher)
        try:
            with _without_zip_crc32():
                torch.save(obj, sink)
        except RuntimeError as exc:  # torch's zip writer swallows the OS's error (a full disk)
            raise (sink.error or exc) from None  # and fails on its check: "unexpected pos"
        finally:
            hasher.close()
    return sink.size, hasher.future


@contextlib.contextmanager
def _without_zip_crc32():
    """Skip torch.save's per-record CRC32s, where torch lets us (>= 2.5).

    They cost about half of torch.save's time and add nothing here: meta.json holds the
    sha256 of the whole file, verified on every load, and torch.load does not need them.
    The setting is global, so it is restored at once.
    """
    get = getattr(torch.serialization, "get_crc32_options", None)
    set_ = getattr(torch.serialization, "set_crc32_options", None)
    if get is None or set_ is None:
        yield
        return
    previous = get()
    set_(False)
    try:
        yield
    finally:
        set_(previous)


def _full_meta(step: int, meta: dict) -> dict:
    """The caller's meta plus ours; "files" is filled in once the files are written."""
    ours = {
        "format_version": FORMAT_VERSION,
        "step": int(step),
        "tokens": _count_or_none(meta.get("tokens")),
        "samples": _count_or_none(meta.get("samples")),
        "loss": _finite_or_none(meta.get("loss")),
        "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "run_id": meta["run_id"],
        "versions": {
            "torch": str(torch.__version__),
            "speedtronic": _speedtronic_version(),
            "python": platform.python_version(),
        },
        "param_count": _count_or_none(meta.get("param_count")),
        "config": meta.get("config"),
    }
    extra = {k: v for k, v in meta.items() if k not in ours and k != "files"}
    return {**ours, **extra, "files": None}


def _count_or_none(value: Any) -> Any:
    """NumPy and 0-d tensor integers as plain ints (JSON would store them as strings).

    Anything that is not an integer is returned as is, for meta_fields_problem to refuse.
    """
    if value is None or isinstance(value, bool):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value


def _finite_or_none(value: Any) -> Any:
    """NaN/inf are not JSON; a diverged loss is recorded as null.

    A value that is not a number is returned as is, for meta_fields_problem to refuse.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    try:
        value = float(value)
    except (TypeError, ValueError):
        return value
    return value if math.isfinite(value) else None


def _speedtronic_version() -> str:
    try:
        from speedtronic import __version__

        return str(__version__)
    except ImportError:
        pass
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("speedtronic")
    except PackageNotFoundError:
        return "unknown"


def _clean_up(root: Path, just_written: str, run_id: Any, keep_last: int | None) -> None:
    """Remove stale tmp dirs and apply retention, after the new checkpoint is committed.

    Failures only warn: the save itself succeeded, and the next save retries the cleanup.
    """
    try:
        _remove_stale_tmp_dirs(root)
        if keep_last is not None:
            _apply_retention(root, just_written, run_id, int(keep_last))
    except OSError as exc:
        warnings.warn(f"checkpoint cleanup in {root} failed: {error_reason(exc)}", stacklevel=3)


def _apply_retention(root: Path, just_written: str, run_id: Any, keep_last: int) -> None:
    """Delete this run's complete checkpoints beyond the newest ``keep_last``.

    Only checkpoints that pass the structural check and carry this run_id are counted or
    deleted. A damaged or incomplete one is left for a person to look at (resume already
    skips it, and it may be the only trace of what went wrong), and counting it would let
    it displace a good one; other runs' checkpoints are not this run's to delete.
    """
    mine = [d for d in list_step_dirs(root) if _is_complete_of(d, run_id)]
    for path in mine[:-keep_last]:
        if path.name != just_written:
            remove_checkpoint_dir(path)


def _is_complete_of(path: Path, run_id: Any) -> bool:
    scan = scan_checkpoint(path)
    return scan.status == "ok" and scan.meta["run_id"] == run_id


def _remove_stale_tmp_dirs(root: Path) -> None:
    """Delete ``.tmp-*`` dirs whose writer process is gone (a crash mid-save)."""
    for path in list_tmp_dirs(root):
        pid = parse_tmp_pid(path.name)
        if pid is not None and pid != os.getpid() and not _pid_alive(pid):
            shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists but belongs to someone else
    return True


# --------------------------------------------------------------------------- reading

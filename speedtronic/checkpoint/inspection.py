"""``ckpt inspect`` summaries and ``ckpt prune`` plans, from JSON and headers only. Stdlib only.

Finds the checkpoints a path refers to (a run dir, a checkpoints root or one checkpoint),
summarises each from meta.json and the safetensors header (step, tokens, loss, size,
parameters per module, dtypes, config facts), optionally hashes them, adds the run's loss
history when its metrics JSONL is next to the checkpoints, and plans and applies pruning.
Like ``layout``, it never imports torch. A path that names no checkpoints is a usage error
(ConfigError), never a guess: prune deletes what its path resolves to.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from speedtronic.checkpoint.layout import (
    JSON_ERRORS,
    LATEST_FILE,
    META_FILE,
    MODEL_FILE,
    CheckpointScan,
    error_reason,
    list_step_dirs,
    list_tmp_dirs,
    parse_step,
    read_latest,
    remove_checkpoint_dir,
    scan_checkpoint,
    verify_hashes,
)
from speedtronic.errors import CheckpointError, ConfigError
from speedtronic.observe.history import read_history

# The version of inspect_path's document (``ckpt inspect --format json``).
INSPECT_SCHEMA_VERSION = 1

# safetensors dtype codes -> torch dtype names, for display only.
_DTYPE_NAMES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "C64": "complex64",
}
# config_facts: label -> where the stored (redacted) SpeedtronicConfig keeps it.
_CONFIG_FACTS = {
    "model": "model.name",
    "run_name": "run.name",
    "max_steps": "run.max_steps",
    "precision": "precision.mode",
    "optimizer": "optimizer.name",
    "micro_batch_size": "data.micro_batch_size",
    "target_batch_size": "data.target_batch_size",
    "lr": "optimizer.lr",
}


_WHERE_HINT = "pass a run's output directory, its checkpoints/ directory or a step_* dir"


def resolve_checkpoints(path: str | os.PathLike) -> tuple[Path, list[Path]]:
    """Find the checkpoints ``path`` refers to: ``(root, dirs sorted by step)``.

    ``path`` may be a run's output dir (with ``checkpoints/`` inside), a checkpoints root,
    or one checkpoint dir (then the list holds just it). Leftover ``.tmp-*`` dirs of a root
    are listed too, so that inspect can show them as incomplete. A missing path, a file or a
    directory without checkpoints raises ConfigError.
    """
    path = _existing_dir(path)
    if _looks_like_checkpoint(path):
        return path.parent, [path]
    root = checkpoint_root(path)
    dirs = list_step_dirs(root) + list_tmp_dirs(root)
    if not dirs:
        raise ConfigError(f"no checkpoints found in {path}", hint=_WHERE_HINT)
    return root, sorted(dirs, key=lambda p: (parse_step(p.name) or 0, p.name.startswith(".")))


def checkpoint_root(path: str | os.PathLike) -> Path:
    """The checkpoints root ``path`` names: a run dir's ``checkpoints/``, or ``path`` itself.

    Anything else raises ConfigError: a missing path, a file, one checkpoint (pruning "its
    root" would delete its siblings) or a directory with no trace of checkpoints in it.
    """
    path = _existing_dir(path)
    if _looks_like_checkpoint(path):
        raise ConfigError(
            f"{path} is one checkpoint, not a checkpoints directory",
            hint=f"pass the directory that holds it ({path.parent}) or the run's output dir",
        )
    if (path / "checkpoints").is_dir():
        return path / "checkpoints"
    if (path / LATEST_FILE).is_file() or list_step_dirs(path) or list_tmp_dirs(path):
        return path
    raise ConfigError(f"no checkpoints found in {path}", hint=_WHERE_HINT)


def _existing_dir(path: str | os.PathLike) -> Path:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path} does not exist", hint=_WHERE_HINT)
    if not path.is_dir():
        raise ConfigError(f"{path} is not a directory", hint=_WHERE_HINT)
    return path


def _looks_like_checkpoint(path: Path) -> bool:
    if not path.is_dir():
        return False
    if parse_step(path.name) is not None:
        return True
    return any((path / name).exists() for name in (META_FILE, MODEL_FILE))


def inspect_checkpoint(path: str | os.PathLike, verify: bool = False) -> dict:
    """JSON-serialisable summary of one checkpoint dir from meta.json and the header only.

    status is "unverified" when the structure and sizes are fine but nothing was hashed,
    "ok" only when ``verify`` hashed both files and they match meta.json, else "incomplete"
    or "damaged" with the reason in problem.
    """
    scan = scan_checkpoint(path)
    status, problem = scan.status, scan.problem
    if status == "ok":
        problem = verify_hashes(scan) if verify else None
        status = "damaged" if problem else "ok" if verify else "unverified"
    meta, header = scan.meta or {}, scan.header or {}
    by_module, dtypes = _summarise_tensors(header)
    param_count = meta.get("param_count")
    if param_count is None and header:
        param_count = sum(m["params"] for m in by_module.values())
    step = meta.get("step", parse_step(scan.path.name))
    return {
        "name": scan.path.name,
        "path": str(scan.path),
        "step": step,
        "run_id": meta.get("run_id"),
        "tokens": meta.get("tokens"),
        "samples": meta.get("samples"),
        "loss": meta.get("loss"),
        "created_at": meta.get("created_at"),
        "status": status,
        "problem": problem,
        "size_bytes": _dir_size(scan.path),
        "param_count": param_count,
        "params_by_module": by_module,
        "dtypes": dtypes,
        "tied": _aliases(header),
        "is_latest": _latest_or_none(scan.path.parent) == scan.path.name,
        "config_facts": config_facts(meta.get("config")),
        "tokenizer": meta.get("tokenizer"),  # the run's tokenizer record (checkpoint.tokenizer)
        "eval_sets": meta.get("eval_sets"),  # eval.sets' newest figures, per set name
    }


def inspect_path(path: str | os.PathLike, verify: bool = False) -> dict:
    """``{"schema_version", "root", "latest", "verified", "checkpoints": [inspect_checkpoint
    (...), ...], "history"}``; history is ``read_history`` of the run's metrics JSONL, or None
    when none is found (``metrics_file``) or it cannot be read."""
    root, dirs = resolve_checkpoints(path)
    metrics = metrics_file(root, dirs)
    try:
        history = read_history(metrics) if metrics else None
    except OSError:
        history = None
    return {
        "schema_version": INSPECT_SCHEMA_VERSION,
        "root": str(root),
        "latest": _latest_or_none(root),
        "verified": verify,
        "checkpoints": [inspect_checkpoint(d, verify) for d in dirs],
        "history": history,
    }


def metrics_file(root: Path, dirs: list[Path]) -> Path | None:
    """The metrics JSONL the run of these checkpoints wrote, if it is still there.

    Its ``logging.json_file``, from the newest checkpoint whose meta.json records a config:
    as is when absolute, else in the run's output dir, which is the checkpoints root's parent
    in the default layout. Failing that, in the default layout, the run dir's only ``*.jsonl``
    file. Outside the default layout a relative log is not looked for (``metrics_file_for``).
    """
    run_dir = root.parent if root.name == "checkpoints" else None
    return metrics_file_for(run_dir, _stored_config(dirs))


def metrics_file_for(run_dir: Path | None, config: dict) -> Path | None:
    """``metrics_file`` given the run dir (None outside the default layout) and its stored
    config; ``runs`` calls it with the config of the one meta.json it read.

    Only the run's own directory is searched (and an absolute ``logging.json_file``): its
    stored ``run.output_dir`` is where it ran, relative to a working directory we cannot
    know, and whatever sits there now may be another run (issue 53).
    """
    logging = config.get("logging")
    name = logging.get("json_file") if isinstance(logging, dict) else None
    candidates = []
    if isinstance(name, str) and name:
        if Path(name).is_absolute():
            candidates.append(Path(name))
        elif run_dir is not None:
            candidates.append(run_dir / name)
    elif run_dir is not None:
        found = sorted(run_dir.glob("*.jsonl"))
        candidates += found if len(found) == 1 else []
    return next((c for c in candidates if c.is_file()), None)


def _stored_config(dirs: list[Path]) -> dict:
    for d in reversed(dirs):
        try:
            meta = json.loads((d / META_FILE).read_text(encoding="utf-8"))
        except (OSError, *JSON_ERRORS):
            continue
        if isinstance(meta, dict) and isinstance(meta.get("config"), dict):
            return meta["config"]
    return {}


def _summarise_tensors(header: dict) -> tuple[dict, dict]:
    by_module: dict[str, dict[str, int]] = {}
    dtypes: dict[str, int] = {}
    for key, entry in header.items():
        if key == "__metadata__" or not isinstance(entry, dict):
            continue
        numel = 1
        for dim in entry.get("shape", []):
            numel *= int(dim)
        begin, end = entry["data_offsets"]
        module = by_module.setdefault(key.split(".", 1)[0], {"params": 0, "size_bytes": 0})
        module["params"] += numel
        module["size_bytes"] += int(end) - int(begin)
        dtype = _DTYPE_NAMES.get(entry.get("dtype"), str(entry.get("dtype")).lower())
        dtypes[dtype] = dtypes.get(dtype, 0) + 1
    return by_module, dtypes


def _aliases(header: dict) -> dict:
    """Tied weights stored once: {alias key: stored key} from the safetensors metadata."""
    raw = (header.get("__metadata__") or {}).get("aliases")
    try:
        aliases = json.loads(raw) if raw else {}
    except JSON_ERRORS:
        return {}
    return aliases if isinstance(aliases, dict) else {}


def tokenizer_text(entry: dict) -> str:
    """The tokenizer line of ``ckpt inspect``: what the checkpoint records of it."""
    record = entry.get("tokenizer")
    if not isinstance(record, dict):
        return "not recorded (the run's tokenizer is unknown, or the checkpoint predates it)"
    if record.get("kind") == "byte":
        return "byte-level (ids are UTF-8 bytes)"
    return f"{record.get('file')} beside the weights ({record.get('vocab_size')} tokens)"


def config_facts(config: object) -> dict:
    """A few headline settings from a stored (redacted) config."""
    facts = {}
    for label, dotted in _CONFIG_FACTS.items():
        node = config
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, (str, int, float, bool)):
            facts[label] = node
    return facts


def _latest_or_none(root: Path) -> str | None:
    try:
        return read_latest(root)
    except CheckpointError:
        return None


def _dir_size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass  # deleted while we walked: it no longer takes space
    return total


def plan_prune(path: str | os.PathLike, keep: int) -> list[dict]:
    """Checkpoints that pruning to the newest ``keep`` complete ones (any run_id) would delete.

    ``path`` must name a checkpoints root or a run dir holding ``checkpoints/`` (see
    ``checkpoint_root``). Only checkpoints that pass the structural check are counted or
    deleted, as in retention: damaged and incomplete ones are left alone (``left_alone``
    lists them), so ``keep=N`` leaves N usable checkpoints wherever there were N. The one
    latest.json points to is never planned for deletion, even when it is not among the
    newest. ``.tmp-*`` dirs are left alone too: one may be a write in progress.
    """
    return prune_plan(path, keep)[0]


def prune_plan(path: str | os.PathLike, keep: int) -> tuple[list[dict], list[dict]]:
    """``(delete, kept)``: ``plan_prune``'s list, and the complete checkpoints it keeps, each
    with a ``reason`` a person can check (issue 21: "nothing to prune" beside two
    checkpoints did not say why). Both newest first."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ConfigError(f"keep must be an integer >= 1, got {keep!r}")
    root = checkpoint_root(path)
    latest = _latest_or_none(root)
    complete = [s for s in _scans_newest_first(root) if s.status == "ok"]
    current = next((s.meta["run_id"] for s in complete if s.path.name == latest), None)
    delete, kept = [], []
    for index, scan in enumerate(complete):
        entry = {"name": scan.path.name, "path": str(scan.path), "step": parse_step(scan.path.name)}
        reasons = _keep_reasons(index, keep, scan.path.name == latest)
        if not reasons:
            delete.append({**entry, "size_bytes": _dir_size(scan.path)})
            continue
        run_id = scan.meta["run_id"]
        if current is not None and run_id != current:
            reasons.append(f"written by another run (run_id {run_id}) than latest.json's")
        kept.append({**entry, "run_id": run_id, "reason": "; ".join(reasons)})
    return delete, kept


def _keep_reasons(index: int, keep: int, is_latest: bool) -> list[str]:
    reasons = []
    if index < keep:
        newest = "the newest complete checkpoint" if keep == 1 else f"one of the newest {keep}"
        reasons.append(f"{newest} (--keep {keep})")
    if is_latest:
        reasons.append("latest.json points to it" + ("" if index < keep else ", so never pruned"))
    return reasons


def left_alone(path: str | os.PathLike) -> list[dict]:
    """The damaged and incomplete ``step_*`` dirs that prune never deletes, newest first."""
    return [
        {"name": s.path.name, "path": str(s.path), "status": s.status, "problem": s.problem}
        for s in _scans_newest_first(checkpoint_root(path))
        if s.status != "ok"
    ]


def _scans_newest_first(root: Path) -> list[CheckpointScan]:
    return [scan_checkpoint(d) for d in reversed(list_step_dirs(root))]


def apply_prune(plan: list[dict]) -> None:
    """Delete the dirs of a ``plan_prune`` plan; an OSError -> CheckpointError naming the dir."""
    for item in plan:
        path = Path(item["path"])
        # Re-check at delete time: the run may have moved latest.json since the plan was made.
        if _latest_or_none(path.parent) == path.name:
            raise CheckpointError(f"refusing to delete {path}: latest.json points to it")
        try:
            remove_checkpoint_dir(path)
        except OSError as exc:
            raise CheckpointError(f"could not delete {path}: {error_reason(exc)}") from exc

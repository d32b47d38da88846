"""The master's persisted state: outer step, global weights, momentum, settled deltas and the
keyframe its publishes build on (``global_update``; none with ``global_dtype: fp32``).

In ``state_dir``: ``tensors-<sha>.safetensors`` (weights, momentum), ``processed-<sha>.json``
(identities of settled deltas) and ``step_<outer_step:010d>.json``, a small manifest written
last that names both with their sha256. Names are content-addressed, so a save never
overwrites a file a manifest names, and a crash at any moment leaves the previous state whole.
I3: ``save`` refuses a lower outer step, or other weights under the same step; ``load`` returns
the newest state whose files verify. Never pickle: safetensors and JSON only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import Tensor

from speedtronic.checkpoint.files import fsync_dir, replace_atomically
from speedtronic.distributed.global_update import Keyframe
from speedtronic.distributed.protocol import BadDelta, check_nodes
from speedtronic.distributed.round_record import RoundChain, parse_chain
from speedtronic.errors import CheckpointError

STATE_FORMAT = "speedtronic-master-1"
KEEP_STATES = 2  # the newest state and one to fall back to if it turns out damaged
_MANIFEST_RE = re.compile(r"step_(\d{10})\.json")
_DATA_RE = re.compile(r"(tensors|processed)-[0-9a-f]{16}\.(safetensors|json)")
_TMP_PREFIX = ".tmp-"
MASTER_ID_FILE = "master_id"  # this master's name in step_count.json, made once per state dir
_MASTER_ID_RE = re.compile(r"[0-9a-f]{16}")
_WEIGHTS, _MOMENTUM, _KEYFRAME = "weights/", "momentum/", "keyframe/"
GLOBAL_DTYPES = ("fp32", "int8", "int4", "deltas")
Tensors = dict[str, Tensor]  # by parameter name, as in a state_dict


@dataclass
class MasterState:
    """What the master must never lose: outer step, global weights, momentum, settled ids.

    In ``state_dir``: ``tensors-<sha>.safetensors`` (weights, momentum), ``processed-<sha>.json``
    (identities) and ``step_<outer_step:010d>.json``, the small manifest written last naming
    both with their sha256. Names are content-addressed, so a save never overwrites a file a
    manifest names and a crash at any moment leaves the previous state whole. ``load`` returns
    the newest state whose files verify. The newest ``KEEP_STATES`` states are kept.
    """

    outer_step: int
    global_weights: Tensors
    optimizer_state: dict[str, Any] = field(default_factory=dict)
    processed: set[str] = field(default_factory=set)
    # node -> its newest applied delta (step_count's ``nodes``): what each node's installs
    # reapply depends on it, so it is this master's to keep, never the repo's to say
    nodes: dict[str, Any] = field(default_factory=dict)
    # node -> [tokens per step, outer step last heard]: the fleet's pace, which sets every
    # round's share and what nodes reapply; lost, a restart would publish a pace of 0
    fleet: dict[str, list[float]] = field(default_factory=dict)
    # what this step's publish builds on (global_dtype int8 / int4): a republish of the step
    # must give the same bytes (I3), so it is saved with the step
    keyframe: Keyframe | None = None
    # the ``global_dtype`` the step was published in (None: an older int8 / int4 state that
    # did not say): another one would publish other weights under the same step (I3)
    global_dtype: str | None = None
    # global_dtype deltas: the rounds since the keyframe this step publishes (``round_record``)
    round_chain: RoundChain | None = None

    def save(self, state_dir: str | os.PathLike) -> Path:
        """Write atomically and durably; return the manifest.

        I3: raises CheckpointError rather than write a lower outer step than one on disk, or
        other weights under the same step (a published step always means the same weights).
        A failed write (a full disk) raises CheckpointError naming the file; what was on disk
        stays whole (names are content-addressed, the manifest is written last).
        """
        root = Path(state_dir)
        try:
            return self._save(root)
        except OSError as exc:
            where = exc.filename or root
            raise CheckpointError(
                f"cannot save master state (outer step {self.outer_step}) to {where}: "
                f"{exc.strerror or exc}"
            ) from exc

    def _save(self, root: Path) -> Path:
        root.mkdir(parents=True, exist_ok=True)
        buffers = self.optimizer_state.get("momentum_buffer", {})
        flat = {_WEIGHTS + k: t for k, t in self.global_weights.items()}
        flat.update({_MOMENTUM + k: t for k, t in buffers.items()})
        if self.keyframe is not None:
            flat.update({_KEYFRAME + k: t for k, t in self.keyframe.weights.items()})
        flat = {k: t.detach().to("cpu", torch.float32).contiguous() for k, t in flat.items()}
        data = safetensors.torch.save(flat)
        _refuse_going_back(root, self.outer_step, hashlib.sha256(data).hexdigest())
        manifest = {
            "format": STATE_FORMAT,
            "outer_step": self.outer_step,
            "saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "tensors": _write_content(root, "tensors.safetensors", data),
            "processed": _write_content(
                root, "processed.json", json.dumps(sorted(self.processed)).encode()
            ),
            "nodes": self.nodes,
            "fleet": self.fleet,
            "keyframe_step": self.keyframe.step if self.keyframe else None,
            "global_dtype": self.global_dtype,
        }
        if self.round_chain is not None:
            manifest["round_chain"] = self.round_chain.to_metadata()
        fsync_dir(root)  # the data files' names are durable before a manifest names them
        path = root / f"step_{self.outer_step:010d}.json"
        _replace(path, json.dumps(manifest, indent=2).encode())
        # The manifest is in place: the state is saved. Nothing after may fail the save, or the
        # master would drop a round whose step is on disk and then refuse to save that step again
        with contextlib.suppress(OSError):
            fsync_dir(root)
            _prune(root)
        return path

    @classmethod
    def load(
        cls, state_dir: str | os.PathLike, log: Callable[[str], None] | None = None
    ) -> MasterState | None:
        """The newest state whose files verify, or None; each skipped one goes to ``log``."""
        root = Path(state_dir)
        log = log or (lambda message: warnings.warn(message, stacklevel=3))
        for step in sorted(_manifest_steps(root), reverse=True):
            try:
                return _read_state(root, step)
            except (CheckpointError, OSError, ValueError) as exc:
                log(f"master state step {step} in {root} is unusable ({exc}); trying an older one")
        return None


def newest_saved_step(state_dir: str | os.PathLike) -> int | None:
    """The newest outer step with a manifest in ``state_dir``, usable or not; None if none:
    a publish follows its save, so no publish of this master's is past it (I3)."""
    return max(_manifest_steps(Path(state_dir)), default=None)


def _manifest_steps(root: Path) -> list[int]:
    names = [p.name for p in root.iterdir()] if root.is_dir() else []
    return [int(m.group(1)) for name in names if (m := _MANIFEST_RE.fullmatch(name))]


def _refuse_going_back(root: Path, step: int, sha256: str) -> None:
    newest = max(_manifest_steps(root), default=-1)
    try:  # an unreadable manifest says nothing about the weights: replacing it is fine
        same = newest == step and _read_manifest(root, step)["tensors"].get("sha256") == sha256
    except (CheckpointError, OSError, ValueError):
        same = True
    if newest >= step and not same:
        raise CheckpointError(
            f"master state in {root} is at outer step {newest}; refusing to save step {step} "
            "over it (I3: the outer step never goes back, a step always means the same weights)",
            hint=f"if step {newest} is damaged, move step_{newest:010d}.json aside yourself",
        )


def _write_content(root: Path, kind: str, data: bytes) -> dict[str, str]:
    """Write under a name derived from the content; rewritten even if present, so a damaged
    file of the same name never survives a save."""
    digest = hashlib.sha256(data).hexdigest()
    stem, ext = kind.split(".")
    name = f"{stem}-{digest[:16]}.{ext}"
    _replace(root / name, data)
    return {"file": name, "sha256": digest}


def _replace(path: Path, data: bytes) -> None:
    """``replace_atomically``, its errors naming ``path`` (a write's OSError names no file)."""
    try:
        replace_atomically(path, data)
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise


def _prune(root: Path) -> None:
    """Keep the newest KEEP_STATES manifests and the files they name; drop the rest."""
    steps = sorted(_manifest_steps(root), reverse=True)
    try:
        kept = [_read_manifest(root, step) for step in steps[:KEEP_STATES]]
    except (CheckpointError, OSError, ValueError):
        return  # cannot tell what a damaged manifest needs: delete nothing
    keep = {m[kind]["file"] for m in kept for kind in ("tensors", "processed")}
    for step in steps[KEEP_STATES:]:
        (root / f"step_{step:010d}.json").unlink(missing_ok=True)
    for path in root.iterdir():
        ours = path.name.startswith(_TMP_PREFIX) or _DATA_RE.fullmatch(path.name)
        if ours and path.name not in keep:
            path.unlink(missing_ok=True)


def _read_manifest(root: Path, step: int) -> dict[str, Any]:
    manifest = json.loads((root / f"step_{step:010d}.json").read_bytes())
    if not isinstance(manifest, dict) or manifest.get("format") != STATE_FORMAT:
        raise CheckpointError(f"manifest format is not {STATE_FORMAT}")
    if manifest.get("outer_step") != step:
        raise CheckpointError(f"manifest says outer step {manifest.get('outer_step')!r}")
    for kind in ("tensors", "processed"):
        entry = manifest.get(kind)
        if not isinstance(entry, dict) or not _DATA_RE.fullmatch(str(entry.get("file"))):
            raise CheckpointError(f"manifest entry {kind!r} is malformed")
    return manifest


def _read_verified(root: Path, entry: dict[str, Any]) -> bytes:
    data = (root / entry["file"]).read_bytes()
    if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        raise CheckpointError(f"{entry['file']} does not match its sha256 (torn or damaged save)")
    return data


def _read_state(root: Path, step: int) -> MasterState:
    manifest = _read_manifest(root, step)
    data = _read_verified(root, manifest["tensors"])
    try:  # never pickle: safetensors parses data only; its error types vary across versions
        tensors = safetensors.torch.load(data)
    except Exception as exc:
        raise CheckpointError(f"tensors unreadable: {exc}") from None
    processed = json.loads(_read_verified(root, manifest["processed"]))
    if not isinstance(processed, list) or not all(isinstance(i, str) for i in processed):
        raise CheckpointError("processed identities are not a list of strings")
    parts = {
        prefix: {k[len(prefix) :]: t for k, t in tensors.items() if k.startswith(prefix)}
        for prefix in (_WEIGHTS, _MOMENTUM, _KEYFRAME)
    }
    weights, buffers, keyframe = parts[_WEIGHTS], parts[_MOMENTUM], parts[_KEYFRAME]
    if (
        not weights
        or sum(map(len, parts.values())) != len(tensors)
        or set(buffers) - set(weights)
        or (keyframe and keyframe.keys() != weights.keys())
    ):
        raise CheckpointError(
            "tensor names are not weights/<name>, momentum/<weight name>, keyframe/<weight name>"
        )
    if not all(t.dtype == torch.float32 and bool(t.isfinite().all()) for t in tensors.values()):
        raise CheckpointError("tensors are not finite float32")
    try:  # absent in states of older versions: then the repo's summary is the best there is
        nodes = check_nodes(manifest.get("nodes", {}))
    except ValueError as exc:
        raise CheckpointError(f"manifest nodes: {exc}") from None
    fleet = _checked_fleet(manifest.get("fleet", {}))
    kept = _checked_keyframe(manifest.get("keyframe_step"), keyframe, step)
    state = MasterState(step, weights, {"momentum_buffer": buffers}, set(processed), nodes, fleet)
    state.keyframe = kept
    state.global_dtype = checked_global_dtype(manifest.get("global_dtype"), kept)
    state.round_chain = _checked_chain(manifest.get("round_chain"), step)
    return state


def _checked_chain(meta: Any, step: int) -> RoundChain | None:
    """The manifest's ``round_chain`` (global_dtype deltas), checked as a node checks it."""
    if meta is None:
        return None
    try:
        chain = parse_chain(meta) if isinstance(meta, dict) else None
    except BadDelta as exc:
        raise CheckpointError(f"manifest round_chain: {exc}") from None
    if chain is None or chain.outer_step != step:
        raise CheckpointError(f"manifest round_chain is not the chain of outer step {step}")
    return chain


def checked_global_dtype(value: Any, keyframe: Any) -> str | None:
    """A saved ``global_dtype``; absent (older states): fp32 when there is no keyframe (every
    int8 / int4 step saves one), else unknown (None)."""
    if value is None:
        return "fp32" if keyframe is None else None
    if value not in GLOBAL_DTYPES:
        raise CheckpointError(f"manifest global_dtype {value!r} is not one of {GLOBAL_DTYPES}")
    return value


def _checked_keyframe(step: Any, weights: Tensors, outer_step: int) -> Keyframe | None:
    """The manifest's ``keyframe_step`` and the keyframe tensors: both or neither."""
    if step is None and not weights:
        return None
    valid = isinstance(step, int) and not isinstance(step, bool) and 0 <= step <= outer_step
    if not (valid and weights):
        raise CheckpointError(f"manifest keyframe_step {step!r} does not fit its tensors")
    return Keyframe(step, weights)


def _checked_fleet(fleet: Any) -> dict[str, list[float]]:
    """The manifest's ``fleet``: node -> [tokens per step > 0, outer step >= 0]."""
    ok = isinstance(fleet, dict) and all(
        isinstance(v, list)
        and len(v) == 2
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
        and v[0] > 0
        and v[1] >= 0
        for v in fleet.values()
    )
    if not ok:
        raise CheckpointError("manifest fleet is not node -> [tokens per step, outer step]")
    return {str(k): [float(v[0]), int(v[1])] for k, v in fleet.items()}


def master_id(state_dir: str | os.PathLike) -> str:
    """This master's id, stored in its state dir at first use: step_count.json carries it, so a
    master tells its own publish from another master's (I3), on any transport."""
    root = Path(state_dir)
    path = root / MASTER_ID_FILE
    try:
        text = path.read_text(encoding="ascii").strip()
        if _MASTER_ID_RE.fullmatch(text):
            return text
    except (OSError, ValueError):
        pass  # absent or damaged: a new id (the repo then looks like another master's until
        # this one publishes, which the start-up check handles)
    new = secrets.token_hex(8)
    try:
        root.mkdir(parents=True, exist_ok=True)
        replace_atomically(path, new.encode() + b"\n")
        fsync_dir(root)
    except OSError as exc:
        raise CheckpointError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return new

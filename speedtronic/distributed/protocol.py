"""The DumbDiLoCo shared-repo layout, its names and the delta header. Stdlib only.

This module owns what every node must agree on without loading a tensor: the paths in the
shared repo (``global/latest.safetensors``, ``global/step_count.json``,
``nodes/<node_id>/delta_<seq:08d>.safetensors``), the rule that makes a ``node_id`` safe to
use as a path segment, the format strings stamped into safetensors metadata, and
``DeltaHeader``, the metadata a delta carries, with its strict parser. Everything read from
the repo is untrusted (DESIGN.md section 5, I4), so parsing refuses rather than guesses and
raises ``BadDelta`` with a one-line reason. It must never import torch or safetensors: the
transport and the CLI use it to list and name files cheaply.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from speedtronic.errors import DamagedRepoFile

DELTA_FORMAT = "speedtronic-delta-1"
# Compatible additions to a delta-1 header, which older masters ignore: revision 2 adds
# ``final`` (the node's last delta of its run: the end of a run is a protocol event, I6) and
# ``end_step`` (the node's optimizer step at the boundary, so a resumed node never sends an inner
# loop twice, I1). ``format`` guards incompatible changes; ``revision`` names the additions.
DELTA_REVISION = 2
WEIGHTS_FORMAT = "speedtronic-global-1"
# A global published as an update on a keyframe (``distributed.global_dtype`` int8 / int4): the
# file at GLOBAL_WEIGHTS holds (weights - keyframe) in packed codes, its header names the
# keyframe, full weights stored once under KEYFRAMES_DIR (``global_update``).
UPDATE_FORMAT = "speedtronic-global-update-1"
KEYFRAMES_DIR = "global/keyframes"
_KEYFRAME_RE = re.compile(r"global/keyframes/[0-9]{12,19}-[0-9a-f]{16}\.safetensors")

GLOBAL_WEIGHTS = "global/latest.safetensors"
STEP_COUNT = "global/step_count.json"
NODES_DIR = "nodes"
# nodes/<node_id>/node.json: the node's run has begun (I6), so a master whose own run ends
# first waits for that node's last delta. Its presence is the message: a master never reads it.
NODE_FILE = "node.json"
ANNOUNCEMENT = "a node's announcement"  # its ``delta_path_problem``: not a delta, but ours

ENCODINGS = ("fp32", "bf16", "int8", "int4", "int2")

# A node_id becomes a directory name on every node and in the Hub repo, so it is limited to
# characters that are safe everywhere, starts with a letter or digit (no hidden files, no
# option-like names) and is at most 64 characters. Always used with fullmatch.
NODE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# Any number of digits (other tools name deltas delta_<local_step>): the name is not the
# identity, content is (I1), so delta_1 and delta_00000001 cannot count one delta twice.
# 18 digits at most (``MAX_COUNT``), as every count the protocol parses.
_DELTA_NAME_RE = re.compile(r"delta_([0-9]{1,18})\.safetensors")
DELTA_NAME_RULE = "delta_<digits>.safetensors"
# Canonical non-negative decimal integers only: int() would also take " 1", "+1", "1_0".
# 18 digits at most, so a hostile header cannot make huge numbers.
_COUNT_RE = re.compile(r"0|[1-9][0-9]{0,17}")
MAX_COUNT = 10**18 - 1  # the largest count a name or a header holds (18 digits)
# A node counts on from an outer step or a sequence number the repo names (the next publish,
# its next delta), so it takes one only below this (``leaves_room``): one near MAX_COUNT would
# leave it no room. A tenth of the 18 digits is beyond any run (a round a nanosecond for 3 years)
MAX_RUNNING_COUNT = 10**17 - 1
_MAX_CREATED_AT_CHARS = 64
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_MAX_NODES = 100_000  # entries of step_count.json's "nodes"; a fleet is far smaller
_INT_FIELDS = ("seq", "base_outer_step", "steps", "tokens")
_FLAGS = {"1": True, "0": False}  # how a boolean travels in safetensors metadata (strings)
# Where a bucket keeps each published global (``weights_key`` in step_count.json, which is the
# commit point): named by outer step and content, so a publish never overwrites an object a
# reader may be fetching. A directory or Hub repo has no such field (one file, replaced).
WEIGHTS_DIR = "global/weights"
_WEIGHTS_KEY_RE = re.compile(r"global/weights/[0-9]{12,19}-[0-9a-f]{16}\.safetensors")
_STR_FIELDS = ("node_id", "encoding", "created_at")
# A worker process's chain of increments (kept across --resume); optional for older nodes
_CHAIN_RE = re.compile(r"[0-9a-f]{8,32}")


class BadDelta(Exception):
    """A delta (or global weights file) that must not be used; the message is the reason.

    Defined here so the torch-free header parser can raise it; ``codec`` re-exports it.
    """


def check_node_id(node_id: str) -> str:
    """Return ``node_id`` unchanged if it is safe as a path segment, else raise ValueError."""
    if not isinstance(node_id, str) or not NODE_ID_RE.fullmatch(node_id):
        raise ValueError(
            f"node_id {short_repr(node_id)}: must be 1-64 characters of letters, digits, '_', '.' "
            "or '-', starting with a letter or digit"
        )
    # The regex already excludes them; kept explicit because they are the dangerous ones.
    if node_id in (".", ".."):
        raise ValueError(f"node_id {node_id!r}: must not be '.' or '..'")
    return node_id


def leaves_room(count: int) -> bool:
    """Whether a node may count on from ``count`` (an outer step, a delta's seq) and stay within
    the 18 digits names and headers hold, however long it runs."""
    return count <= MAX_RUNNING_COUNT


def _check_count(name: str, value: object, limit: int = MAX_COUNT) -> int:
    # bool is an int subclass; True as a sequence number is a bug, not a value.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} {short_repr(value)}: must be an integer >= 0")
    if value > limit:
        raise ValueError(f"{name} {short_repr(value)}: must be at most {limit}")
    return value


def delta_path(node_id: str, seq: int) -> str:
    """``nodes/<node_id>/delta_<seq:08d>.safetensors``, the one place the name is built."""
    check_node_id(node_id)
    _check_count("seq", seq)
    return f"{NODES_DIR}/{node_id}/delta_{seq:08d}.safetensors"


def node_file_path(node_id: str) -> str:
    """``nodes/<node_id>/node.json``: where a node says its run has begun."""
    return f"{NODES_DIR}/{check_node_id(node_id)}/{NODE_FILE}"


def announced_node(path: str) -> str | None:
    """The node id of ``nodes/<node_id>/node.json``; None for any other path."""
    if delta_path_problem(path) != ANNOUNCEMENT:
        return None
    return path.split("/")[1]


def parse_delta_path(path: str) -> tuple[str, int] | None:
    """``(node_id, seq)`` for ``nodes/<node_id>/delta_<digits>.safetensors``; None otherwise."""
    if not isinstance(path, str) or delta_path_problem(path) is not None:
        return None
    _, node_id, name = path.split("/")
    return node_id, int(_DELTA_NAME_RE.fullmatch(name).group(1))


def delta_path_problem(path: str) -> str | None:
    """Why a repo path under ``nodes/`` is not a delta (logged once by the master), or None."""
    parts = path.split("/") if isinstance(path, str) else []
    if len(parts) < 2 or parts[0] != NODES_DIR:
        return f"not under {NODES_DIR}/"
    if len(parts) == 2:
        return "not inside a node's folder"
    node_id = parts[1]
    if not NODE_ID_RE.fullmatch(node_id) or node_id in (".", ".."):
        return f"the folder {short_repr(node_id)} is not a valid node id"
    if len(parts) > 3:
        return "nested below a node's folder"
    if parts[2] == NODE_FILE:
        return ANNOUNCEMENT
    if not _DELTA_NAME_RE.fullmatch(parts[2]):
        return f"not named {DELTA_NAME_RULE}"
    return None


def check_deletable(path: str) -> str:
    """``path`` if a master may delete it: a delta's path (``delta_path_problem``), the only
    file a round consumes, a node's announcement (deleted with its last delta, I6), or a
    keyframe a newer one superseded. Anything else is a bug to see, never a file to remove
    (ValueError)."""
    if is_keyframe_path(path):
        return path
    problem = delta_path_problem(path) if isinstance(path, str) else "not a path"
    if problem not in (None, ANNOUNCEMENT):
        raise ValueError(f"refusing to delete {short_repr(path)}: {problem}")
    return path


@dataclass(frozen=True)
class DeltaHeader:
    """What a delta says about itself; stored as the safetensors ``__metadata__``.

    ``base_outer_step`` is the global outer step the worker trained from (staleness is
    measured against it), ``steps`` and ``tokens`` how much training the delta holds (tokens
    weight the mean), ``encoding`` how the tensors are stored. ``chain`` names the worker
    process's chain of increments: consecutive deltas of one chain add up, while a worker that
    restarted without its checkpoint starts a new chain from a global (``outer.aggregate``).
    Invalid values raise ValueError at construction, so a header object is always well-formed.
    """

    node_id: str
    seq: int
    base_outer_step: int
    steps: int
    tokens: int
    encoding: str
    created_at: str
    chain: str = ""  # "": a node that predates chains; its deltas form one chain
    # The node's last delta of its run (revision 2). With ``steps`` 0 and zero tensors it is an
    # end marker: sent when the run ended with nothing left to send, it carries no work.
    final: bool = False
    end_step: int = 0  # the node's optimizer step at the boundary; 0: not said (revision 1)

    def __post_init__(self) -> None:
        check_node_id(self.node_id)
        for name in (*_INT_FIELDS, "end_step"):
            _check_count(name, getattr(self, name))
        if not isinstance(self.final, bool):
            raise ValueError(f"final {short_repr(self.final)}: must be true or false")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding {short_repr(self.encoding)}: must be one of {ENCODINGS}")
        created = self.created_at
        if not isinstance(created, str) or not 0 < len(created) <= _MAX_CREATED_AT_CHARS:
            raise ValueError(f"created_at {short_repr(created)}: must be a short timestamp string")
        if not (created.isascii() and created.isprintable()):
            raise ValueError(f"created_at {short_repr(created)}: must be printable ASCII")
        if self.chain and not (isinstance(self.chain, str) and _CHAIN_RE.fullmatch(self.chain)):
            raise ValueError(f"chain {short_repr(self.chain)}: must be 8-32 lowercase hex digits")

    def to_metadata(self) -> dict[str, str]:
        """The header as safetensors metadata (all strings), with ``format`` added."""
        fields = asdict(self)
        final, end_step = fields.pop("final"), fields.pop("end_step")
        meta = {key: str(value) for key, value in fields.items() if value != ""}
        if final:
            meta["final"] = "1"
        if end_step:
            meta["end_step"] = str(end_step)
        meta["format"], meta["revision"] = DELTA_FORMAT, str(DELTA_REVISION)
        return meta

    @classmethod
    def from_metadata(cls, meta: dict[str, str]) -> DeltaHeader:
        """Parse untrusted metadata; raise BadDelta on anything missing, ill-typed or wrong.

        Unknown extra keys are ignored so a later format can add fields without breaking
        older masters; ``format`` guards the incompatible changes.
        """
        if not isinstance(meta, dict):
            raise BadDelta("header metadata missing")
        if meta.get("format") != DELTA_FORMAT:
            raise BadDelta(
                f"header format {short_repr(meta.get('format'))}, expected {DELTA_FORMAT}"
            )
        missing = [key for key in _INT_FIELDS + _STR_FIELDS if key not in meta]
        if missing:
            raise BadDelta(f"header metadata missing {', '.join(missing)}")
        fields: dict[str, object] = {key: meta[key] for key in _STR_FIELDS}
        if "chain" in meta:
            fields["chain"] = meta["chain"]
        for key in _INT_FIELDS:
            fields[key] = parse_count(key, meta[key])
        if "end_step" in meta:
            fields["end_step"] = parse_count("end_step", meta["end_step"])
        if "final" in meta:
            if meta["final"] not in _FLAGS:
                raise BadDelta(f"header final {short_repr(meta['final'])}: must be '1' or '0'")
            fields["final"] = _FLAGS[meta["final"]]
        try:
            return cls(**fields)
        except ValueError as exc:
            raise BadDelta(f"header {exc}") from None


def parse_count(name: str, text: object) -> int:
    """A metadata string that must hold a canonical integer >= 0; BadDelta otherwise."""
    if not isinstance(text, str) or not _COUNT_RE.fullmatch(text):
        raise BadDelta(f"header {name} {short_repr(text)}: must be an integer >= 0")
    return int(text)


def short_repr(value: object) -> str:
    """A bounded, one-line repr for messages that quote untrusted values."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ---------------------------------------------------------------------------- step_count.json


def weights_key(outer_step: int, sha256: str) -> str:
    """``global/weights/<outer_step:012d>-<sha256[:16]>.safetensors``, a bucket's global."""
    _check_count("outer_step", outer_step)
    if not isinstance(sha256, str) or not _SHA256_RE.fullmatch(sha256):
        raise ValueError(f"sha256 {short_repr(sha256)}: must be 64 lowercase hex digits")
    return f"{WEIGHTS_DIR}/{outer_step:012d}-{sha256[:16]}.safetensors"


def keyframe_path(outer_step: int, sha256: str) -> str:
    """``global/keyframes/<outer_step:012d>-<sha256[:16]>.safetensors``: full weights that
    updates build on, named by step and content, so a publish never overwrites one a reader
    may be fetching."""
    return KEYFRAMES_DIR + weights_key(outer_step, sha256)[len(WEIGHTS_DIR) :]


def is_keyframe_path(path: object) -> bool:
    return isinstance(path, str) and _KEYFRAME_RE.fullmatch(path) is not None


def is_weights_key(path: object) -> bool:
    """Whether ``path`` is a name ``weights_key`` gives (anything else there is not ours)."""
    return isinstance(path, str) and _WEIGHTS_KEY_RE.fullmatch(path) is not None


def parse_step_count(data: bytes) -> dict[str, Any]:
    """``step_count.json``'s bytes as a dict whose every field is type- and range-checked.

    The file is written by the master but lives in a repo anyone with write access can edit
    (I4), so a field of the wrong type or range, or one this format does not have, raises
    ``DamagedRepoFile`` (a TransportError) naming the file and the field, and the reader keeps
    what it has. Every field is known: a later master that adds one raises ``format``, which
    a node of this version then refuses by name rather than installing what it cannot check.
    The optional fields may be absent (older masters wrote fewer); ``ended`` (``run_ended``)
    is the newest, and a node of an earlier version refuses, naming it, only the step count of
    a run that has ended.
    """
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise DamagedRepoFile(f"{STEP_COUNT} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise DamagedRepoFile(f"{STEP_COUNT} is not a JSON object")
    try:
        return _checked_step_count(value)
    except ValueError as exc:
        raise DamagedRepoFile(f"{STEP_COUNT}: {exc}") from None


STEP_COUNT_FORMAT = 1  # what ``format`` says; a file of another format is refused by name
_STEP_COUNT_FIELDS = (
    "outer_step",
    "updated_at",
    "weights_sha256",
    "format",
    "fleet_tokens_per_step",
    "master",
    "nodes",
    "weights_key",
    "ended",
    # sha256 of the frozen parameters every node starts from (``distributed/frozen_base``):
    # recorded by a master whose model has some (a fleet that fine-tunes with ``model.lora``)
    "base_sha256",
)


def _checked_step_count(value: dict) -> dict[str, Any]:
    unknown = sorted(str(key) for key in value if key not in _STEP_COUNT_FIELDS)
    if unknown:
        raise ValueError(
            f"unknown field {short_repr(unknown[0])} (format {STEP_COUNT_FORMAT} has "
            f"{', '.join(_STEP_COUNT_FIELDS)})"
        )
    if "outer_step" not in value:
        raise ValueError("no outer_step")
    checked: dict[str, Any] = {"outer_step": _check_count("outer_step", value["outer_step"])}
    if "format" in value and value["format"] != STEP_COUNT_FORMAT:
        raise ValueError(
            f"format {short_repr(value['format'])}: this node reads format {STEP_COUNT_FORMAT} "
            "(a master of another speedtronic version wrote it?)"
        )
    if "format" in value:
        checked["format"] = STEP_COUNT_FORMAT
    if "fleet_tokens_per_step" in value:
        rate = value["fleet_tokens_per_step"]
        checked["fleet_tokens_per_step"] = _check_count("fleet_tokens_per_step", rate)
    for key in ("updated_at", "master"):
        if key in value:
            checked[key] = _check_short_text(key, value[key])
    for key in ("weights_sha256", "base_sha256"):
        if key in value:
            checked[key] = _check_sha256(key, value[key])
    if "weights_key" in value:
        checked["weights_key"] = _checked_weights_key(value["weights_key"], checked)
    if "nodes" in value:
        checked["nodes"] = check_nodes(value["nodes"])
    if "ended" in value:
        if not isinstance(value["ended"], bool):
            raise ValueError(f"ended {short_repr(value['ended'])}: must be true or false")
        checked["ended"] = value["ended"]
    return checked


def run_ended(counted: dict[str, Any] | None) -> bool:
    """Whether a parsed step count is the run's end: its master ran the final round and said so
    (``ended``, written with that publish and removed by a master started again). A step count
    of an older master never says so: its run is taken as going on."""
    return bool(counted and counted.get("ended") is True)


def _check_sha256(name: str, sha: object) -> str:
    if not isinstance(sha, str) or not _SHA256_RE.fullmatch(sha):
        raise ValueError(f"{name} {short_repr(sha)}: must be 64 lowercase hex digits")
    return sha


def _checked_weights_key(key: object, checked: dict[str, Any]) -> str:
    """A bucket's ``weights_key``: a name ``weights_key`` gives, for this step and sha256."""
    if not is_weights_key(key):
        raise ValueError(
            f"weights_key {short_repr(key)}: must be "
            f"{WEIGHTS_DIR}/<outer step>-<16 hex digits>.safetensors"
        )
    sha = checked.get("weights_sha256")
    if sha is not None and key != weights_key(checked["outer_step"], sha):
        raise ValueError(
            f"weights_key {short_repr(key)}: names another outer step or other weights than "
            "outer_step and weights_sha256"
        )
    return key


def check_nodes(nodes: object) -> dict[str, dict[str, Any]]:
    """``{node_id: {seq, base_outer_step, tokens, last_delta_at, end_step, chain, final,
    steps_total, tokens_total}}``,
    each field checked (``final``: the node's last delta of its run is in this global, I6); a
    field of another name is refused, as in the rest of the file."""
    if not isinstance(nodes, dict) or len(nodes) > _MAX_NODES:
        raise ValueError(f"nodes: must be an object of at most {_MAX_NODES} node ids")
    checked = {}
    for node_id, info in nodes.items():
        if not NODE_ID_RE.fullmatch(node_id) or not isinstance(info, dict):
            raise ValueError(f"nodes: {short_repr(node_id)} must be a node id with an object")
        where = f"nodes.{node_id}"
        unknown = sorted(str(key) for key in info if key not in _NODE_FIELDS)
        if unknown:
            raise ValueError(f"{where}: unknown field {short_repr(unknown[0])}")
        entry = {k: _check_count(f"{where}.{k}", info[k]) for k in _NODE_COUNTS if k in info}
        if "last_delta_at" in info:
            entry["last_delta_at"] = _check_short_text(
                f"{where}.last_delta_at", info["last_delta_at"]
            )
        if "final" in info:
            if not isinstance(info["final"], bool):
                raise ValueError(f"{where}.final {short_repr(info['final'])}: must be a boolean")
            entry["final"] = info["final"]
        if "chain" in info:
            if not isinstance(info["chain"], str) or not _CHAIN_RE.fullmatch(info["chain"]):
                raise ValueError(f"{where}.chain {short_repr(info['chain'])}: must be hex digits")
            entry["chain"] = info["chain"]
        checked[node_id] = entry
    return checked


# steps_total, tokens_total: every applied delta of the node, added up (what the global holds)
_NODE_COUNTS = ("seq", "base_outer_step", "tokens", "end_step", "steps_total", "tokens_total")
_NODE_FIELDS = (*_NODE_COUNTS, "last_delta_at", "final", "chain")


def _check_short_text(name: str, value: object) -> str:
    if not isinstance(value, str) or len(value) > 64 or not value.isprintable():
        raise ValueError(f"{name} {short_repr(value)}: must be printable text of at most 64 chars")
    return value


def fleet_totals(nodes: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    """What a global holds, from its step count's ``nodes``: the fleet's optimizer steps and
    tokens (every applied delta, added up; None where a master of an earlier version did not
    count them) and whether every node's run has ended (``ended``: the run's final global)."""
    entries = list((nodes or {}).values())
    counted = entries and all("steps_total" in e for e in entries)
    return {
        "optimizer_steps": sum(e["steps_total"] for e in entries) if counted else None,
        "tokens": sum(e.get("tokens_total", 0) for e in entries) if counted else None,
        "ended": bool(entries) and all(e.get("final") for e in entries),
    }

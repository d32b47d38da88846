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

import re
from dataclasses import asdict, dataclass

DELTA_FORMAT = "speedtronic-delta-1"
WEIGHTS_FORMAT = "speedtronic-global-1"

GLOBAL_WEIGHTS = "global/latest.safetensors"
STEP_COUNT = "global/step_count.json"
NODES_DIR = "nodes"

ENCODINGS = ("fp32", "bf16", "int8")

# A node_id becomes a directory name on every node and in the Hub repo, so it is limited to
# characters that are safe everywhere, starts with a letter or digit (no hidden files, no
# option-like names) and is at most 64 characters. Always used with fullmatch.
NODE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_DELTA_NAME_RE = re.compile(r"delta_(\d{8,})\.safetensors")
# Canonical non-negative decimal integers only: int() would also take " 1", "+1", "1_0".
# 18 digits keeps every value below 2**63, so a hostile header cannot make huge numbers.
_COUNT_RE = re.compile(r"0|[1-9][0-9]{0,17}")
_MAX_CREATED_AT_CHARS = 64
_INT_FIELDS = ("seq", "base_outer_step", "steps", "tokens")
_STR_FIELDS = ("node_id", "encoding", "created_at")


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


def _check_count(name: str, value: object) -> int:
    # bool is an int subclass; True as a sequence number is a bug, not a value.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} {short_repr(value)}: must be an integer >= 0")
    return value


def delta_path(node_id: str, seq: int) -> str:
    """``nodes/<node_id>/delta_<seq:08d>.safetensors``, the one place the name is built."""
    check_node_id(node_id)
    _check_count("seq", seq)
    return f"{NODES_DIR}/{node_id}/delta_{seq:08d}.safetensors"


def parse_delta_path(path: str) -> tuple[str, int] | None:
    """``(node_id, seq)`` for a path exactly as ``delta_path`` builds it; None otherwise."""
    if not isinstance(path, str):
        return None
    parts = path.split("/")
    if len(parts) != 3 or parts[0] != NODES_DIR:
        return None
    match = _DELTA_NAME_RE.fullmatch(parts[2])
    if match is None or not NODE_ID_RE.fullmatch(parts[1]) or parts[1] in (".", ".."):
        return None
    seq = int(match.group(1))
    # Only the canonical spelling: "delta_000000001" must not alias seq 1 under another name.
    if delta_path(parts[1], seq) != path:
        return None
    return parts[1], seq


@dataclass(frozen=True)
class DeltaHeader:
    """What a delta says about itself; stored as the safetensors ``__metadata__``.

    ``base_outer_step`` is the global outer step the worker trained from (staleness is
    measured against it), ``steps`` and ``tokens`` how much training the delta holds (tokens
    weight the mean), ``encoding`` how the tensors are stored. Invalid values raise
    ValueError at construction, so a header object is always well-formed.
    """

    node_id: str
    seq: int
    base_outer_step: int
    steps: int
    tokens: int
    encoding: str
    created_at: str

    def __post_init__(self) -> None:
        check_node_id(self.node_id)
        for name in _INT_FIELDS:
            _check_count(name, getattr(self, name))
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding {short_repr(self.encoding)}: must be one of {ENCODINGS}")
        created = self.created_at
        if not isinstance(created, str) or not 0 < len(created) <= _MAX_CREATED_AT_CHARS:
            raise ValueError(f"created_at {short_repr(created)}: must be a short timestamp string")
        if not (created.isascii() and created.isprintable()):
            raise ValueError(f"created_at {short_repr(created)}: must be printable ASCII")

    def to_metadata(self) -> dict[str, str]:
        """The header as safetensors metadata (all strings), with ``format`` added."""
        meta = {key: str(value) for key, value in asdict(self).items()}
        meta["format"] = DELTA_FORMAT
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
        for key in _INT_FIELDS:
            fields[key] = parse_count(key, meta[key])
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

"""The round record of ``distributed.global_dtype: deltas``: what the master publishes instead of
weights. Stdlib only.

With ``deltas`` the file at ``global/latest.safetensors`` holds no tensors: its header metadata
carries a ``RoundChain``, the rounds since the newest keyframe (full weights under
``global/keyframes/``, renewed every ``keyframe_every`` outer steps and at the run's end). Each
``Round`` names the deltas that make its outer step (repo path, sha256 of the file's bytes, its
size, its coefficient: the fleet policy's node weight, staleness discount, token share and
fleet share multiplied out), the outer learning rate, and the sha256 of the weights it yields
(``round_apply.weights_sha256``). A node replays the chain from its own verified step, or from
the keyframe, with ``round_apply.apply_round``, the one function the master uses too.

The chain is cumulative (one file, one commit per round as before), so a node that missed rounds
finds them all in the newest record, and a delta a round names stays in the repo until the next
keyframe covers it. The record is untrusted (I4): ``parse_chain`` checks every field's type and
range and refuses anything else with ``BadDelta`` naming the field.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from speedtronic.distributed.protocol import (
    BadDelta,
    delta_path_problem,
    parse_count,
    short_repr,
)

ROUND_FORMAT = "speedtronic-rounds-1"
CHAIN_KEY = "rounds"  # the metadata key holding the chain's JSON
NEWEST_KEY = "newest_keyframe_sha256"  # the chain's step is a keyframe too
MAX_ROUNDS = 4096  # rounds between keyframes (keyframe_every is the master's)
MAX_DELTAS = 4096  # deltas in one round
MAX_CHAIN_CHARS = 16 << 20  # a hostile header cannot make a node parse more than this
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_ROUND_KEYS = {"outer_step", "lr", "deltas", "weights_sha256"}
_DELTA_KEYS = {"path", "sha256", "bytes", "coef"}


@dataclass(frozen=True)
class RoundDelta:
    """One delta a round applies: where it is, which bytes, and its weight in the round."""

    path: str
    sha256: str
    size: int
    coef: float

    @property
    def node_id(self) -> str:
        return self.path.split("/")[1]


@dataclass(frozen=True)
class Round:
    """Outer step ``outer_step`` = the previous one - ``lr`` * sum(coef * delta), in order."""

    outer_step: int
    lr: float
    deltas: tuple[RoundDelta, ...]
    weights_sha256: str


@dataclass(frozen=True)
class RoundChain:
    """The rounds from the keyframe at ``keyframe_step`` to ``outer_step``, one per step.
    ``newest_sha256``: the step is a keyframe too (its file's sha256): a node that holds none
    of the chain reads that one, while a node a few rounds behind still replays them."""

    outer_step: int
    keyframe_step: int
    keyframe_sha256: str
    rounds: tuple[Round, ...]
    newest_sha256: str = ""

    def to_metadata(self) -> dict[str, str]:
        """The safetensors metadata of the record file (all strings, canonical JSON)."""
        rounds = [
            {
                "outer_step": r.outer_step,
                "lr": r.lr,
                "deltas": [
                    {"path": d.path, "sha256": d.sha256, "bytes": d.size, "coef": d.coef}
                    for d in r.deltas
                ],
                "weights_sha256": r.weights_sha256,
            }
            for r in self.rounds
        ]
        meta = {
            "format": ROUND_FORMAT,
            "outer_step": str(self.outer_step),
            "keyframe_step": str(self.keyframe_step),
            "keyframe_sha256": self.keyframe_sha256,
            CHAIN_KEY: json.dumps(rounds, separators=(",", ":"), sort_keys=True),
        }
        if self.newest_sha256:
            meta[NEWEST_KEY] = self.newest_sha256
        return meta

    def since(self, step: int) -> tuple[Round, ...]:
        """The rounds after outer step ``step`` (within the chain)."""
        return self.rounds[max(0, step - self.keyframe_step) :]

    def round_at(self, step: int) -> Round | None:
        index = step - self.keyframe_step - 1
        return self.rounds[index] if 0 <= index < len(self.rounds) else None


def parse_chain(meta: dict[str, str]) -> RoundChain:
    """A record file's metadata as a checked ``RoundChain``; BadDelta naming what is wrong."""
    if meta.get("format") != ROUND_FORMAT:
        raise BadDelta(
            f"round record format {short_repr(meta.get('format'))}, expected {ROUND_FORMAT}"
        )
    step = parse_count("outer_step", meta.get("outer_step"))
    keyframe_step = parse_count("keyframe_step", meta.get("keyframe_step"))
    keyframe_sha = _sha("keyframe_sha256", meta.get("keyframe_sha256"))
    text = meta.get(CHAIN_KEY)
    if not isinstance(text, str) or len(text) > MAX_CHAIN_CHARS:
        raise BadDelta(f"round record {CHAIN_KEY}: missing or over {MAX_CHAIN_CHARS} characters")
    try:
        rounds = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise BadDelta(f"round record {CHAIN_KEY} is not valid JSON ({exc})") from None
    if not isinstance(rounds, list) or len(rounds) > MAX_ROUNDS:
        raise BadDelta(f"round record {CHAIN_KEY}: must be a list of at most {MAX_ROUNDS} rounds")
    if keyframe_step + len(rounds) != step:
        raise BadDelta(
            f"round record: {len(rounds)} rounds after the keyframe at outer step "
            f"{keyframe_step} do not reach outer step {step}"
        )
    parsed = tuple(_round(r, keyframe_step + 1 + i) for i, r in enumerate(rounds))
    newest = _sha(NEWEST_KEY, meta[NEWEST_KEY]) if NEWEST_KEY in meta else ""
    if newest and not parsed:
        raise BadDelta(f"round record {NEWEST_KEY}: the keyframe's own step names no newer one")
    return RoundChain(step, keyframe_step, keyframe_sha, parsed, newest)


def _round(value: object, expected_step: int) -> Round:
    where = f"round record outer step {expected_step}"
    if not isinstance(value, dict) or set(value) != _ROUND_KEYS:
        raise BadDelta(f"{where}: must be an object with {sorted(_ROUND_KEYS)}")
    if value["outer_step"] != expected_step or type(value["outer_step"]) is not int:
        raise BadDelta(f"{where}: says outer step {short_repr(value['outer_step'])}")
    lr = _finite(f"{where} lr", value["lr"])
    if lr <= 0:
        raise BadDelta(f"{where} lr {lr}: must be > 0")
    deltas = value["deltas"]
    if not isinstance(deltas, list) or len(deltas) > MAX_DELTAS:
        raise BadDelta(f"{where} deltas: must be a list of at most {MAX_DELTAS} deltas")
    parsed = tuple(_delta(d, where) for d in deltas)
    if len({d.path for d in parsed}) != len(parsed):
        raise BadDelta(f"{where} deltas: a path is named twice")
    return Round(
        expected_step, lr, parsed, _sha(f"{where} weights_sha256", value["weights_sha256"])
    )


def _delta(value: object, where: str) -> RoundDelta:
    if not isinstance(value, dict) or set(value) != _DELTA_KEYS:
        raise BadDelta(f"{where}: a delta must be an object with {sorted(_DELTA_KEYS)}")
    path = value["path"]
    problem = delta_path_problem(path) if isinstance(path, str) else "not a string"
    if problem is not None:
        raise BadDelta(f"{where}: delta path {short_repr(path)}: {problem}")
    size = value["bytes"]
    if type(size) is not int or not 0 < size < 1 << 50:
        raise BadDelta(f"{where}: {path} bytes {short_repr(size)}: must be a positive integer")
    coef = _finite(f"{where}: {path} coef", value["coef"])
    return RoundDelta(path, _sha(f"{where}: {path} sha256", value["sha256"]), size, coef)


def _finite(name: str, value: object) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise BadDelta(f"{name} {short_repr(value)}: must be a finite number")
    return float(value)


def _sha(name: str, value: object) -> str:
    if not isinstance(value, str) or not _SHA256_RE.fullmatch(value):
        raise BadDelta(f"{name} {short_repr(value)}: must be 64 lowercase hex digits")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")

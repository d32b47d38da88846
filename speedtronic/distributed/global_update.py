"""The global as a keyframe plus a compressed update (``distributed.global_dtype`` int8 / int4).

With ``fp32`` (the default) the master publishes its full float32 weights every round, and a
node downloads all of them every round. Otherwise the file at ``global/latest.safetensors`` is
an *update*: (weights - keyframe), block-quantized at 8 or 4 bits with a float32 scale per 128
values (``blockquant``), whose header names its keyframe: full float32 weights the master
uploads once to ``global/keyframes/<step>-<sha16>.safetensors`` and renews every
``keyframe_every`` outer steps and at the run's last round. A node that holds the keyframe
downloads only the update; a cold start downloads both.

A node's global is keyframe + decode(update), computed in float32 on the CPU, elementwise,
the same on every node and on the master (``Keyframe``, ``GlobalReader``): an outer step means
the same weights everywhere (I3). The master keeps its exact weights and takes every update
against the keyframe afresh, so quantization errors never add up: each global is within one
quantization step of the master's weights, and at a keyframe step it is them exactly. Every
file is untrusted (I4): the update's header, sizes, layout and scales are checked, the keyframe
against the sha256 the update names, the result for NaN/Inf; callers check its norm.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import safetensors.torch
import torch
from torch import Tensor

from speedtronic.distributed import blockquant
from speedtronic.distributed.codec import (
    LAYOUT_KEY,
    PACKED_CODES,
    PACKED_SCALES,
    BadDelta,
    canonical,
    check_entries,
    check_finite,
    check_layout,
    decode_weights,
    encode_weights,
    expected_delta_bytes,
    header_length,
    limits,
    load,
    packed_specs,
    read_header,
    unpacked,
)
from speedtronic.distributed.protocol import (
    GLOBAL_WEIGHTS,
    UPDATE_FORMAT,
    WEIGHTS_FORMAT,
    keyframe_path,
    parse_count,
    short_repr,
)
from speedtronic.distributed.round_apply import RECORD_BYTES, RoundReplayer
from speedtronic.distributed.round_record import ROUND_FORMAT, RoundChain, parse_chain

Tensors = dict[str, Tensor]
GLOBAL_BITS = {"int8": 8, "int4": 4}  # ``distributed.global_dtype``; fp32: full weights
_SHA256_CHARS = frozenset("0123456789abcdef")


@dataclass(frozen=True, eq=False)
class Keyframe:
    """Full weights at ``step`` that updates build on; its file bytes are made once."""

    step: int
    weights: Tensors  # float32 CPU tensors, never changed in place

    @cached_property
    def data(self) -> bytes:
        return encode_weights(self.weights, self.step)

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def path(self) -> str:
        return keyframe_path(self.step, self.sha256)


def as_keyframe(weights: Tensors, step: int) -> Keyframe:
    # a copy: a master (or a test) that changed its weights in place must not move its keyframe
    copies = {k: v.detach().to("cpu", torch.float32, copy=True) for k, v in weights.items()}
    return Keyframe(step, copies)


def encode_global(
    weights: Tensors, outer_step: int, keyframe: Keyframe | None, dtype: str
) -> bytes:
    """What the master publishes for ``weights`` at ``outer_step``: full float32 weights with
    no keyframe (``fp32``), else the update on ``keyframe`` in ``dtype``. Canonical bytes: the
    same inputs give the same sha256, so a master knows its own publish (I3)."""
    if keyframe is None:
        return encode_weights(weights, outer_step)
    update = {
        key: value.detach().to("cpu", torch.float32) - keyframe.weights[key]
        for key, value in weights.items()
    }
    codes, scales = blockquant.pack(update, GLOBAL_BITS[dtype])
    metadata = {
        "format": UPDATE_FORMAT,
        "outer_step": str(outer_step),
        "keyframe_step": str(keyframe.step),
        "keyframe_sha256": keyframe.sha256,
        "encoding": dtype,
        LAYOUT_KEY: blockquant.layout_of(_shapes(weights)),
    }
    tensors = {PACKED_CODES: codes, PACKED_SCALES: scales}
    return canonical(safetensors.torch.save(tensors, metadata=metadata))


def global_bytes_per_round(reference: Tensors, dtype: str, keyframe_every: int) -> int:
    """Tensor bytes a node downloads (and the master uploads) per round, on average: the full
    weights (fp32), or an update plus a keyframe every ``keyframe_every`` rounds."""
    full = expected_delta_bytes(reference, "fp32")
    if dtype == "fp32":
        return full
    if dtype == "deltas":  # what the master uploads (``round_apply.deltas_bytes_per_round``)
        return RECORD_BYTES + full // keyframe_every
    codes, scales = blockquant.packed_sizes(_shapes(reference), GLOBAL_BITS[dtype])
    return codes + 4 * scales + full // keyframe_every


def published_weights(data: bytes, keyframe: Keyframe | None, reference: Tensors) -> Tensors:
    """The weights every node reads from ``data`` (``encode_global``'s bytes) on ``keyframe``."""
    header = update_header(data, reference)
    if header is None or keyframe is None:
        return decode_weights(data, reference)[1]
    return decode_update(data, header, reference, keyframe.weights)


@dataclass(frozen=True)
class UpdateHeader:
    outer_step: int
    keyframe_step: int
    keyframe_sha256: str
    encoding: str
    meta: dict[str, str]

    @property
    def keyframe_path(self) -> str:
        return keyframe_path(self.keyframe_step, self.keyframe_sha256)


def update_header(data: bytes, reference: Tensors) -> UpdateHeader | None:
    """The header of an update file; None for full weights (``codec.decode_weights`` reads
    them); BadDelta for anything else."""
    full = {key: (torch.float32, tuple(value.shape)) for key, value in reference.items()}
    meta, _ = read_header(data, *limits(full))  # full weights: the largest file there is
    found = meta.get("format") if isinstance(meta, dict) else None
    if found == WEIGHTS_FORMAT:
        return None
    if found != UPDATE_FORMAT:
        expected = f"{WEIGHTS_FORMAT} or {UPDATE_FORMAT}"
        raise BadDelta(f"weights format {short_repr(found)}, expected {expected}")
    encoding, sha = meta.get("encoding"), meta.get("keyframe_sha256")
    if encoding not in GLOBAL_BITS:
        raise BadDelta(
            f"update encoding {short_repr(encoding)}: must be one of {list(GLOBAL_BITS)}"
        )
    if not isinstance(sha, str) or len(sha) != 64 or not set(sha) <= _SHA256_CHARS:
        raise BadDelta(f"update keyframe_sha256 {short_repr(sha)}: not 64 lowercase hex digits")
    step, base = parse_count("outer_step", meta.get("outer_step")), meta.get("keyframe_step")
    keyframe_step = parse_count("keyframe_step", base)
    if keyframe_step > step:
        raise BadDelta(f"update at outer step {step} names a later keyframe ({keyframe_step})")
    return UpdateHeader(step, keyframe_step, sha, encoding, meta)


def decode_update(
    data: bytes, header: UpdateHeader, reference: Tensors, keyframe: Tensors
) -> Tensors:
    """keyframe + the update's decoded values, after its sizes, layout and scales passed."""
    shapes = _shapes(reference)
    specs = packed_specs(shapes, GLOBAL_BITS[header.encoding])
    _, entries = read_header(data, *limits(specs))
    check_entries(entries, specs, len(data) - 8 - header_length(data))
    check_layout(header.meta, shapes, "global's update")
    update = unpacked(load(data, specs), GLOBAL_BITS[header.encoding], shapes)
    weights = {key: keyframe[key] + update[key] for key in reference}
    check_finite(weights)
    return weights


@dataclass(frozen=True)
class GlobalRead:
    """A validated global: its outer step, weights, the sha256 of the file at
    ``global/latest.safetensors`` (what step_count.json names; None unless the reader hashes)
    and the bytes it took."""

    outer_step: int
    weights: Tensors
    sha256: str | None
    bytes_read: int
    keyframe: str | None = None  # the keyframe's path, for an update
    replayed: bool = False  # rounds replayed on it: the master's weights, checked by sha256


class GlobalReader:
    """Reads the repo's global, full weights or an update, keeping the last keyframe it read
    so a node that holds it downloads only the update. ``hashed``: say the file's sha256 (a
    master checks the repo by it; a node has no use for it, so it does not spend the time)."""

    def __init__(self, transport: Any, reference: Tensors, hashed: bool = False):
        self.transport, self.reference, self.hashed = transport, reference, hashed
        self.keyframe: tuple[str, Tensors] | None = None  # (sha256, weights)
        self.replayer = RoundReplayer(transport, reference, self._keyframe_at)

    def read(self, max_bytes: int) -> GlobalRead | None:
        """The global, or None when the repo has none; BadDelta / DamagedRepoFile if bad."""
        data = self.transport.read(GLOBAL_WEIGHTS, max_bytes)
        if data is None:
            return None
        data = bytes(data)
        sha = hashlib.sha256(data).hexdigest() if self.hashed else None
        chain = round_chain(data, self.reference)
        if chain is not None:  # global_dtype deltas: replay the rounds (``round_apply``)
            weights, got = self.replayer.read(chain, max_bytes)
            read = len(data) + got
            return GlobalRead(chain.outer_step, weights, sha, read, chain_keyframe(chain), True)
        header = update_header(data, self.reference)
        if header is None:
            step, weights = decode_weights(data, self.reference)
            return GlobalRead(step, weights, sha, len(data))
        keyframe, got = self._keyframe(header, max_bytes)
        weights = decode_update(data, header, self.reference, keyframe)
        read = len(data) + got
        return GlobalRead(header.outer_step, weights, sha, read, header.keyframe_path)

    def _keyframe(self, header: UpdateHeader, max_bytes: int) -> tuple[Tensors, int]:
        """The keyframe an update builds on (read once, then kept)."""
        return self._keyframe_at(
            header.keyframe_step, header.keyframe_sha256, header.outer_step, max_bytes, "update"
        )

    def _keyframe_at(
        self, at: int, sha: str, outer_step: int, max_bytes: int, what: str = "record"
    ) -> tuple[Tensors, int]:
        """The keyframe at outer step ``at`` whose file has ``sha`` (read once, then kept)."""
        if self.keyframe is not None and self.keyframe[0] == sha:
            return self.keyframe[1], 0
        path = keyframe_path(at, sha)
        data = self.transport.read(path, max_bytes)
        if data is None:
            raise BadDelta(f"{path} is missing: the global at outer step {outer_step} "
                           "builds on it")  # fmt: skip
        data = bytes(data)
        if hashlib.sha256(data).hexdigest() != sha:
            raise BadDelta(f"{path} does not match the sha256 the global's {what} names")
        step, weights = decode_weights(data, self.reference)
        if step != at:
            raise BadDelta(f"{path} holds outer step {step}, the {what} says {at}")
        self.keyframe = (sha, weights)
        return weights, len(data)


def chain_keyframe(chain: RoundChain) -> str:
    """The path of the newest keyframe a round chain names (the step's own, else its base)."""
    if chain.newest_sha256:
        return keyframe_path(chain.outer_step, chain.newest_sha256)
    return keyframe_path(chain.keyframe_step, chain.keyframe_sha256)


def round_chain(data: bytes, reference: Tensors) -> RoundChain | None:
    """The round chain of a record file (``global_dtype: deltas``); None for other globals."""
    full = {key: (torch.float32, tuple(value.shape)) for key, value in reference.items()}
    meta, entries = read_header(data, *limits(full))
    if not isinstance(meta, dict) or meta.get("format") != ROUND_FORMAT:
        return None
    if entries:
        raise BadDelta("the round record holds tensors: it must hold none")
    return parse_chain(meta)


def _shapes(tensors: Tensors) -> dict[str, tuple[int, ...]]:
    return {key: tuple(value.shape) for key, value in tensors.items()}

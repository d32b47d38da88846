"""Bytes <-> tensors for DumbDiLoCo: delta and global-weights encoding, decoding and validation.

This module owns the safetensors files that travel through the shared repo: a worker's
pseudo-gradient (``pseudo_gradient``, ``encode_delta`` in fp32, bf16, int8 with per-row
scales, or int4 / int2 with per-block scales, ``blockquant``: every tensor's codes in one
packed tensor and their scales in another, so a small model's file is not mostly header) and
the master's full weights (``encode_weights``; its updates on a keyframe are
``global_update``'s, with the checks here). Decoding treats the bytes as hostile (DESIGN.md
section 5, I4): nothing is ever unpickled; the 8-byte length and the JSON header are parsed
and checked first (size, metadata, path agreement, keys, dtypes, shapes, offsets), tensors
are materialised only after that, then checked for NaN/Inf and a
plausible norm. Every refusal is a ``BadDelta`` whose message is a one-line reason.
"""

from __future__ import annotations

import json
import math

import safetensors.torch
import torch
from torch import Tensor

from speedtronic.distributed import blockquant
from speedtronic.distributed.protocol import (
    ENCODINGS,
    WEIGHTS_FORMAT,
    BadDelta,
    DeltaHeader,
    parse_count,
    parse_delta_path,
    short_repr,
)

__all__ = [
    "BadDelta",
    "SCALE_SUFFIX",
    "PACKED_CODES",
    "PACKED_SCALES",
    "check_plausible_global",
    "global_norm",
    "decode_delta",
    "decode_own_delta",
    "decode_weights",
    "encode_delta",
    "encode_weights",
    "expected_delta_bytes",
    "pseudo_gradient",
]

SCALE_SUFFIX = "::scale"
# An int4 / int2 file holds two tensors: every delta tensor's codes, then every one's scales,
# in the order of their sorted names; ``layout`` in the metadata fingerprints those names and
# shapes, so a file packed for another model is refused rather than cut at the wrong places.
PACKED_CODES, PACKED_SCALES = "::codes", "::scales"
LAYOUT_KEY = "layout"
# Room for the JSON header on top of the tensor data: a fixed part for the metadata, plus a
# per-entry part, so that models with many tensors are not refused for their header alone.
HEADER_SLACK_BYTES = 64 << 10
_HEADER_BYTES_PER_ENTRY = 160

_ENCODED_DTYPE = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "int8": torch.int8,
    "int4": torch.uint8,
    "int2": torch.uint8,
}
_SAFETENSORS_DTYPE = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.int8: "I8",
    torch.uint8: "U8",
}

# What a file must contain: name -> (dtype, shape).
Specs = dict[str, tuple[torch.dtype, tuple[int, ...]]]


def pseudo_gradient(base: dict[str, Tensor], current: dict[str, Tensor]) -> dict[str, Tensor]:
    """``base - current`` in float32 on the CPU: the direction the outer optimizer descends.

    With this sign the master applies it like a gradient (``w -= lr * delta``), which moves
    the global weights towards where the worker's inner steps went.
    """
    if base.keys() != current.keys():
        raise ValueError(f"pseudo_gradient: keys differ: {sorted(base.keys() ^ current.keys())}")
    delta = {}
    for key, before in base.items():
        after = current[key]
        if before.shape != after.shape:
            raise ValueError(f"pseudo_gradient: {key!r} has shapes {before.shape}, {after.shape}")
        before = before.detach().to(torch.float32)
        delta[key] = (before - after.detach().to(before.device, torch.float32)).cpu()
    return delta


def expected_delta_bytes(reference: dict[str, Tensor], encoding: str) -> int:
    """Bytes of tensor data (no header) of a delta of ``reference`` in ``encoding``."""
    return sum(
        _nbytes(dtype, shape) for dtype, shape in _expected_specs(reference, encoding).values()
    )


def encode_delta(delta: dict[str, Tensor], header: DeltaHeader) -> bytes:
    """A delta as safetensors bytes, stored as ``header.encoding`` says, header as metadata."""
    _expected_specs(delta, header.encoding)  # refuses unknown encodings and reserved names
    metadata = header.to_metadata()
    if header.encoding in blockquant.BITS:
        codes, scales = blockquant.pack(delta, blockquant.BITS[header.encoding])
        tensors = {PACKED_CODES: codes, PACKED_SCALES: scales}
        metadata[LAYOUT_KEY] = blockquant.layout_of(_shapes(delta))
    else:
        tensors = {}
        for key, value in delta.items():
            tensors.update(_named(key, _encoded(value, header.encoding)))
    return canonical(safetensors.torch.save(tensors, metadata=metadata))


def _encoded(value: Tensor, encoding: str) -> Tensor | tuple[Tensor, Tensor]:
    # copy=True: tied weights share storage, which safetensors refuses to save.
    value = value.detach().to("cpu", torch.float32, copy=True).contiguous()
    if encoding == "int8":
        return _quantize_int8(value)
    return value.to(_ENCODED_DTYPE[encoding])


def _named(key: str, encoded: Tensor | tuple[Tensor, Tensor]) -> dict[str, Tensor]:
    if isinstance(encoded, tuple):
        return {key: encoded[0], key + SCALE_SUFFIX: encoded[1]}
    return {key: encoded}


def _shapes(tensors: dict[str, Tensor]) -> dict[str, tuple[int, ...]]:
    return {key: tuple(value.shape) for key, value in tensors.items()}


def canonical(data: bytes) -> bytes:
    """The same safetensors file with its JSON header's keys sorted.

    safetensors writes its header in hash-map order, which differs between calls, so the same
    delta would get other bytes, and another identity (I1), each time it is encoded.
    """
    size = int.from_bytes(data[:8], "little")
    header = json.dumps(json.loads(data[8 : 8 + size]), sort_keys=True, separators=(",", ":"))
    header += " " * (-len(header) % 8)  # keep the data aligned to 8 bytes, as safetensors does
    return len(header).to_bytes(8, "little") + header.encode() + data[8 + size :]


def decode_delta(
    data: bytes, path: str, reference: dict[str, Tensor], max_norm_ratio: float = 10.0
) -> tuple[DeltaHeader, dict[str, Tensor]]:
    """Validate an untrusted delta and return its header and float32 CPU tensors.

    ``path`` is where the bytes were found (``nodes/<node_id>/delta_<seq>.safetensors``); the
    header must agree with it. ``reference`` (the global weights) gives the expected keys and
    shapes and the scale for the norm check. Raises BadDelta with the reason.
    """
    located = parse_delta_path(path)
    if located is None:
        raise BadDelta(f"path {short_repr(path)} is not nodes/<node_id>/delta_<seq>.safetensors")
    if not reference:
        raise BadDelta("no tensors: the reference weights are empty")
    data = bytes(data)
    # The encoding is only known from the header, so the first bound is the loosest one.
    loosest = [limits(_expected_specs(reference, encoding)) for encoding in ENCODINGS]
    meta, entries = read_header(data, max(b for b, _ in loosest), max(f for _, f in loosest))
    header = DeltaHeader.from_metadata(meta)
    node_id, seq = located
    if header.node_id != node_id:
        raise BadDelta(f"header node_id {header.node_id!r} contradicts path node {node_id!r}")
    if header.seq != seq:
        raise BadDelta(f"header seq {header.seq} contradicts path seq {seq}")
    # a tensor of codes per delta tensor: a node of the version before the packed layout
    per_tensor = header.encoding in blockquant.BITS and PACKED_CODES not in entries
    specs = _expected_specs(reference, header.encoding, per_tensor)
    _check_size(len(data), limits(specs)[1])
    check_entries(entries, specs, len(data) - 8 - header_length(data))
    shapes = _shapes(reference)
    if header.encoding in blockquant.BITS and not per_tensor:
        check_layout(meta, shapes, "delta")
    tensors = load(data, specs)
    decoded = _decoded(tensors, header.encoding, shapes)
    check_finite(decoded)
    _check_norm(decoded, reference, max_norm_ratio)
    return header, decoded


def decode_own_delta(
    data: bytes, encoding: str, shapes: dict[str, tuple[int, ...]] | None = None
) -> dict[str, Tensor]:
    """A delta this node encoded itself (an in-flight record), as the float32 tensors a master
    decodes from the same bytes: a node's installs subtract exactly what the master applies.
    int4 / int2 files hold packed codes: ``shapes`` gives the tensors' names and shapes."""
    tensors = safetensors.torch.load(bytes(data))
    if encoding not in blockquant.BITS:
        shapes = {k: tuple(v.shape) for k, v in tensors.items() if not k.endswith(SCALE_SUFFIX)}
    elif shapes is None:
        raise ValueError(f"{encoding} deltas decode to shapes only the weights give")
    return _decoded(tensors, encoding, shapes)


def encode_weights(state: dict[str, Tensor], outer_step: int) -> bytes:
    """Global weights as float32 safetensors bytes with ``format`` and ``outer_step`` metadata."""
    if isinstance(outer_step, bool) or not isinstance(outer_step, int) or outer_step < 0:
        raise ValueError(f"outer_step {short_repr(outer_step)}: must be an integer >= 0")
    tensors = {
        key: value.detach().to("cpu", torch.float32, copy=True).contiguous()
        for key, value in state.items()
    }
    metadata = {"format": WEIGHTS_FORMAT, "outer_step": str(outer_step)}
    # canonical: the same weights at the same step are the same bytes (and sha256), so a master
    # can tell its own publish from another one (I3)
    return canonical(safetensors.torch.save(tensors, metadata=metadata))


def decode_weights(data: bytes, reference: dict[str, Tensor]) -> tuple[int, dict[str, Tensor]]:
    """Validate untrusted global weights; ``(outer_step, float32 CPU tensors)`` or BadDelta.

    Same checks as a delta (size, keys, shapes, dtype, offsets, finiteness) minus the norm:
    weights legitimately move far from any reference over a run.
    """
    if not reference:
        raise BadDelta("no tensors: the reference weights are empty")
    data = bytes(data)
    specs: Specs = {key: (torch.float32, tuple(value.shape)) for key, value in reference.items()}
    meta, entries = read_header(data, *limits(specs))
    if not isinstance(meta, dict) or meta.get("format") != WEIGHTS_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise BadDelta(f"weights format {short_repr(found)}, expected {WEIGHTS_FORMAT}")
    outer_step = parse_count("outer_step", meta.get("outer_step"))
    check_entries(entries, specs, len(data) - 8 - header_length(data))
    tensors = load(data, specs)
    check_finite(tensors)
    return outer_step, {key: tensors[key] for key in reference}


def _expected_specs(reference: dict[str, Tensor], encoding: str, per_tensor: bool = False) -> Specs:
    """The tensors a file of ``reference`` in ``encoding`` holds, int8 scales included;
    ``per_tensor``: int4 / int2 as written before the packed layout (codes and scales per
    tensor), still read so that a fleet can be upgraded a node at a time."""
    if encoding not in _ENCODED_DTYPE:
        raise ValueError(f"encoding {short_repr(encoding)}: must be one of {ENCODINGS}")
    if encoding in blockquant.BITS and not per_tensor:
        return packed_specs(_shapes(reference), blockquant.BITS[encoding])
    specs: Specs = {}
    for key, value in reference.items():
        shape = tuple(value.shape)
        specs[key] = (_ENCODED_DTYPE[encoding], shape)
        if encoding == "int8":
            if key.endswith(SCALE_SUFFIX):
                raise ValueError(f"tensor name {key!r} ends with {SCALE_SUFFIX!r} (reserved)")
            # One scale per row (first dim); a 0-/1-D tensor is a single row.
            specs[key + SCALE_SUFFIX] = (torch.float32, shape[:1] if len(shape) >= 2 else (1,))
        elif encoding in blockquant.BITS:
            codes, scales = blockquant.packed_shapes(math.prod(shape), blockquant.BITS[encoding])
            specs[key], specs[key + SCALE_SUFFIX] = (torch.uint8, codes), (torch.float32, scales)
    return specs


def packed_specs(shapes: dict[str, tuple[int, ...]], bits: int) -> Specs:
    """The two tensors of a packed file (``blockquant.pack``) of tensors of ``shapes``."""
    codes, scales = blockquant.packed_sizes(shapes, bits)
    return {PACKED_CODES: (torch.uint8, (codes,)), PACKED_SCALES: (torch.float32, (scales,))}


def check_layout(meta: dict, shapes: dict[str, tuple[int, ...]], what: str) -> None:
    """A packed file's ``layout`` must name ``shapes``: equal sizes cut elsewhere decode wrong."""
    expected = blockquant.layout_of(shapes)
    if meta.get(LAYOUT_KEY) != expected:
        raise BadDelta(
            f"layout {short_repr(meta.get(LAYOUT_KEY))} is not the global's {expected}: the "
            f"{what} was packed for other tensor names or shapes"
        )


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * dtype.itemsize


def limits(specs: Specs) -> tuple[int, int]:
    """``(max header bytes, max file bytes)`` for a file that should hold ``specs``."""
    header = HEADER_SLACK_BYTES + sum(len(key.encode()) + _HEADER_BYTES_PER_ENTRY for key in specs)
    return header, 8 + header + sum(_nbytes(dtype, shape) for dtype, shape in specs.values())


def _check_size(size: int, limit: int) -> None:
    if size > limit:
        raise BadDelta(f"implausible size: {size} bytes, at most {limit} expected")


def header_length(data: bytes) -> int:
    return int.from_bytes(data[:8], "little")


def read_header(data: bytes, max_header: int, max_file: int) -> tuple[object, dict]:
    """``(metadata, tensor entries)`` from the safetensors header, without touching tensors.

    The length prefix is checked against the file and a cap before any JSON is parsed, so a
    hostile length cannot make us read or allocate more than a plausible header.
    """
    _check_size(len(data), max_file)
    if len(data) < 8:
        raise BadDelta("not a safetensors file: shorter than the 8-byte header length")
    length = header_length(data)
    if length < 2 or length > max_header or 8 + length > len(data):
        raise BadDelta(f"not a safetensors file: header length {length} for {len(data)} bytes")
    try:
        header = json.loads(data[8 : 8 + length])
    except (ValueError, RecursionError):  # bad syntax, bad UTF-8, or absurd nesting
        raise BadDelta("not a safetensors file: header is not JSON") from None
    if not isinstance(header, dict):
        raise BadDelta("not a safetensors file: header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if meta is not None and not (
        isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())
    ):
        raise BadDelta("header metadata is not a map of strings")
    return meta, header


def check_entries(entries: dict, specs: Specs, data_bytes: int) -> None:
    """Keys, dtypes, shapes and data offsets of the header against what ``specs`` requires."""
    missing = sorted(specs.keys() - entries.keys())
    if missing:
        raise BadDelta(f"missing tensor {missing[0]!r}" + _and_more(missing))
    extra = sorted(entries.keys() - specs.keys())
    if extra:
        raise BadDelta(f"unexpected tensor {short_repr(extra[0])}" + _and_more(extra))
    spans = []
    for key, (dtype, shape) in specs.items():
        entry = entries[key]
        if not isinstance(entry, dict):
            raise BadDelta(f"tensor {key!r} has no description in the header")
        if entry.get("dtype") != _SAFETENSORS_DTYPE[dtype]:
            found = short_repr(entry.get("dtype"))
            raise BadDelta(
                f"tensor {key!r} has dtype {found}, expected {_SAFETENSORS_DTYPE[dtype]}"
            )
        found_shape = entry.get("shape")
        if not _is_int_list(found_shape) or tuple(found_shape) != shape:
            found = tuple(found_shape) if _is_int_list(found_shape) else short_repr(found_shape)
            raise BadDelta(f"tensor {key!r} has shape {found}, expected {shape}")
        offsets = entry.get("data_offsets")
        if not _is_int_list(offsets) or len(offsets) != 2:
            raise BadDelta(f"tensor {key!r} has malformed data offsets")
        spans.append((offsets[0], offsets[1], key))
    # The spans must tile the data area exactly: a gap hides bytes, an overlap aliases tensors.
    position = 0
    for begin, end, key in sorted(spans):
        if begin != position or end - begin != _nbytes(*specs[key]):
            raise BadDelta(f"tensor {key!r} has data offsets {[begin, end]} that do not fit")
        position = end
    if position != data_bytes:
        raise BadDelta(f"tensor data is {data_bytes} bytes, the header describes {position}")


def _is_int_list(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(item, int) and not isinstance(item, bool) and item >= 0 for item in value
    )


def _and_more(names: list[str]) -> str:
    return f" and {len(names) - 1} more" if len(names) > 1 else ""


def load(data: bytes, specs: Specs) -> dict[str, Tensor]:
    """Tensors from bytes whose header already passed; safetensors only, never pickle."""
    try:
        tensors = safetensors.torch.load(data)
    except Exception as exc:  # the Rust parser's error types vary; all mean "bad bytes"
        raise BadDelta(f"not a safetensors file: {_one_line(exc)}") from None
    # Our JSON parse and the Rust one must agree (e.g. on duplicate keys); check what loaded.
    if tensors.keys() != specs.keys() or any(
        tensors[key].dtype != dtype or tuple(tensors[key].shape) != shape
        for key, (dtype, shape) in specs.items()
    ):
        raise BadDelta("not a safetensors file: loaded tensors differ from the header")
    return tensors


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _quantize_int8(value: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8 with one float32 scale per row (``|x| <= 127 * scale``)."""
    rows = value.flatten(1) if value.dim() >= 2 else value.reshape(1, -1)
    absmax = rows.abs().amax(dim=1) if rows.numel() else rows.new_zeros(rows.shape[0])
    scale = absmax / 127
    # An all-zero row gets scale 0 (decodes to exact zeros); divide by 1 to avoid 0/0.
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))
    quantized = torch.round(rows / divisor[:, None]).clamp_(-127, 127).to(torch.int8)
    return quantized.reshape(value.shape), scale.contiguous()


def _decoded(
    tensors: dict[str, Tensor], encoding: str, shapes: dict[str, tuple[int, ...]]
) -> dict[str, Tensor]:
    """Float32 tensors, keyed like ``shapes``, from a file's (already checked) tensors."""
    if encoding in blockquant.BITS and PACKED_CODES in tensors:
        return unpacked(tensors, blockquant.BITS[encoding], shapes)
    return {key: _dequantized(tensors, key, encoding, shapes[key]) for key in shapes}


def unpacked(tensors: dict[str, Tensor], bits: int, shapes: dict) -> dict[str, Tensor]:
    """The tensors of a packed file whose sizes passed, its scales checked first."""
    _check_scales(tensors[PACKED_SCALES], PACKED_SCALES)
    return blockquant.unpack(tensors[PACKED_CODES], tensors[PACKED_SCALES], shapes, bits)


def _check_scales(scales: Tensor, name: str) -> None:
    # a negative scale would flip a block's signs unseen
    if not bool(((scales >= 0) & scales.isfinite()).all()):
        raise BadDelta(f"tensor {name!r} has a negative, NaN or Inf scale")


def _dequantized(tensors: dict[str, Tensor], key: str, encoding: str, shape: tuple) -> Tensor:
    if encoding in blockquant.BITS:  # codes and scales per tensor (before the packed layout)
        _check_scales(tensors[key + SCALE_SUFFIX], key + SCALE_SUFFIX)
        bits = blockquant.BITS[encoding]
        return blockquant.dequantize(tensors[key], tensors[key + SCALE_SUFFIX], shape, bits)
    values = tensors[key].to(torch.float32)
    if encoding != "int8":
        return values
    scale = tensors[key + SCALE_SUFFIX]
    rows = values.flatten(1) if values.dim() >= 2 else values.reshape(1, -1)
    return (rows * scale[:, None]).reshape(values.shape)


def check_finite(tensors: dict[str, Tensor]) -> None:
    # Checked after dequantization: a finite but huge int8 scale can still overflow to Inf.
    for key, value in tensors.items():
        if not bool(torch.isfinite(value).all()):
            raise BadDelta(f"tensor {key!r} has NaN or Inf values")


def _check_norm(delta: dict[str, Tensor], reference: dict[str, Tensor], ratio: float) -> None:
    """Refuse a delta whose global L2 norm is more than ``ratio`` times the weights' norm.

    An all-zero delta passes on purpose: it cannot move the weights anywhere, it is what a
    worker sends when its weights did not change (e.g. lr 0 in warm-up), and refusing it
    would make such a worker look broken.
    """
    delta_norm, weights_norm = global_norm(delta), global_norm(reference)
    if not delta_norm <= ratio * weights_norm:
        raise BadDelta(
            f"implausible norm: delta L2 norm {delta_norm:.4g} > {ratio:g} x weights norm "
            f"{weights_norm:.4g}"
        )


def check_plausible_global(
    weights: dict[str, Tensor],
    anchor_norm: float,
    anchor: str = "the initial weights",
    travel: float = 0.0,
    ratio: float = 10.0,
) -> None:
    """Refuse a global whose L2 norm is not within [``anchor_norm`` / ``ratio``, ``ratio`` x
    (``anchor_norm`` + ``travel``)] (I4): finite values of 1e30 pass every other check, and
    would stop every node after its next steps.

    The anchor is fixed (a node's own weights at start, a master's initial weights), never the
    global before: a bound against each step before compounds, and globals grown 9x per publish
    pass a 10x check every time. ``travel`` is how far a node's own training has moved its
    weights (the summed norms of its deltas): a fleet's global moves about as far as its nodes'
    deltas do, so honest growth is allowed for and a writer cannot add to it (an optimizer's
    steps do not grow with the weights it is handed). docs/diloco.md has the figures."""
    new = global_norm(weights)
    low, high = anchor_norm / ratio, ratio * (anchor_norm + travel)
    if anchor_norm > 0 and not low <= new <= high:
        moved = f" moved {travel:.4g} by its training since," if travel else ""
        raise BadDelta(
            f"implausible weights: L2 norm {new:.4g} against {anchor_norm:.4g} for {anchor},"
            f"{moved} outside [{low:.4g}, {high:.4g}] ({ratio:g}x)"
        )


def global_norm(tensors: dict[str, Tensor]) -> float:
    # float64 so that a large model's sum of squares neither overflows nor loses the small terms.
    total = sum(float(torch.linalg.vector_norm(t.detach().double())) ** 2 for t in tensors.values())
    return math.sqrt(total)

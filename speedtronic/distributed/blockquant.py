"""Block quantization of tensors to 8, 4 or 2 bits, packed into bytes (deltas: ``int4`` and
``int2``; the global's updates: 8 or 4 bits, ``distributed.global_dtype``).

A tensor is flattened and cut into blocks of ``BLOCK`` values; each block has one float32 scale
and every value becomes a code of ``bits`` bits, packed ``8 // bits`` to a uint8 byte (the
first value in the low bits). A code ``c`` decodes to ``(c - OFFSET[bits]) * scale``: 8 and 4
bits are the symmetric grids -127..127 and -7..7 (scale = the block's largest magnitude / 127
or / 7; the lowest code is never written but decodes within bounds); int2 has no zero level,
-1.5, -0.5, 0.5, 1.5 steps, with the block's RMS as the step (the error-minimising step of a
4-level quantizer of Gaussian values is about one standard deviation), so larger values are
clipped to 1.5 steps: with error feedback the clipped part is sent in later rounds. Many
tensors pack into one codes tensor and one scales tensor (``pack``), cut again by their sorted
names and shapes (``unpack``; ``layout_of`` fingerprints them). Pure tensor arithmetic, no
I/O: the codec validates the files.
"""

from __future__ import annotations

import hashlib
import math

import torch
from torch import Tensor

BLOCK = 128  # values per scale: 4 bytes of scale per 128 values, 1/32 byte per value
BITS = {"int4": 4, "int2": 2}
OFFSET = {8: 128.0, 4: 8.0, 2: 1.5}
_TOP = {8: 127.0, 4: 7.0, 2: 1.5}  # the largest level written
Shapes = dict[str, tuple[int, ...]]


def packed_shapes(numel: int, bits: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(codes shape, scales shape)`` of a tensor of ``numel`` values at ``bits`` bits."""
    return (math.ceil(numel * bits / 8),), (math.ceil(numel / BLOCK),)


def quantize(value: Tensor, bits: int) -> tuple[Tensor, Tensor]:
    """``(packed uint8 codes, float32 scales)`` of a float32 CPU tensor."""
    flat = value.reshape(-1)
    blocks = torch.nn.functional.pad(flat, (0, -flat.numel() % BLOCK)).reshape(-1, BLOCK)
    if bits != 2:
        scale = blocks.abs().amax(dim=1) / _TOP[bits]
    else:
        # the RMS over the block's real values (the padding is not data)
        counts = torch.full((blocks.shape[0],), float(BLOCK))
        if flat.numel() % BLOCK:
            counts[-1] = flat.numel() % BLOCK
        scale = (blocks.square().sum(dim=1) / counts).sqrt()
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))
    levels = blocks / divisor[:, None]
    if bits != 2:
        levels = torch.round(levels)
    else:  # nearest of the half-integer levels
        levels = torch.floor(levels) + 0.5
    codes = (levels.clamp_(-_TOP[bits], _TOP[bits]) + OFFSET[bits]).to(torch.uint8)
    return _pack(codes.reshape(-1)[: flat.numel()], bits), scale.contiguous()


def dequantize(packed: Tensor, scale: Tensor, shape: tuple[int, ...], bits: int) -> Tensor:
    """The float32 tensor of ``shape`` that ``quantize`` encoded (sizes already checked)."""
    numel = math.prod(shape)
    codes = _unpack(packed, bits)[:numel].to(torch.float32) - OFFSET[bits]
    codes = torch.nn.functional.pad(codes, (0, -numel % BLOCK)).reshape(-1, BLOCK)
    return (codes * scale[:, None]).reshape(-1)[:numel].reshape(shape)


def pack(tensors: dict[str, Tensor], bits: int) -> tuple[Tensor, Tensor]:
    """``(codes, scales)``: every tensor's packed codes, then every one's scales, in the order
    of their sorted names."""
    codes, scales = [torch.zeros(0, dtype=torch.uint8)], [torch.zeros(0)]
    for key in sorted(tensors):
        value = tensors[key].detach().to("cpu", torch.float32).contiguous()
        packed, scale = quantize(value, bits)
        codes.append(packed)
        scales.append(scale)
    return torch.cat(codes), torch.cat(scales)


def packed_sizes(shapes: Shapes, bits: int) -> tuple[int, int]:
    """``(codes bytes, scales)`` that ``pack`` makes of tensors of ``shapes``."""
    codes = scales = 0
    for shape in shapes.values():
        (n_codes,), (n_scales,) = packed_shapes(math.prod(shape), bits)
        codes, scales = codes + n_codes, scales + n_scales
    return codes, scales


def unpack(codes: Tensor, scales: Tensor, shapes: Shapes, bits: int) -> dict[str, Tensor]:
    """The float32 tensors, keyed like ``shapes``, that ``pack`` encoded (sizes checked)."""
    decoded, at_code, at_scale = {}, 0, 0
    for key in sorted(shapes):
        (n_codes,), (n_scales,) = packed_shapes(math.prod(shapes[key]), bits)
        decoded[key] = dequantize(
            codes[at_code : at_code + n_codes],
            scales[at_scale : at_scale + n_scales],
            shapes[key],
            bits,
        )
        at_code, at_scale = at_code + n_codes, at_scale + n_scales
    return {key: decoded[key] for key in shapes}


def layout_of(shapes: Shapes) -> str:
    """16 hex digits naming the sorted tensor names and shapes a packed file is cut by."""
    text = "\n".join(f"{key}:{list(shapes[key])}" for key in sorted(shapes))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _pack(codes: Tensor, bits: int) -> Tensor:
    per_byte = 8 // bits
    codes = torch.nn.functional.pad(codes, (0, -codes.numel() % per_byte)).reshape(-1, per_byte)
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8)
    return (codes << shifts).sum(dim=1, dtype=torch.uint8).contiguous()


def _unpack(packed: Tensor, bits: int) -> Tensor:
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8)
    mask = (1 << bits) - 1
    return ((packed[:, None] >> shifts) & mask).reshape(-1)

"""Low-bit block quantization of delta tensors (``int4`` and ``int2``), packed into bytes.

A tensor is flattened and cut into blocks of ``BLOCK`` values; each block has one float32 scale
and every value becomes a code of ``bits`` bits, packed ``8 // bits`` to a uint8 byte (the
first value in the low bits). A code ``c`` decodes to ``(c - OFFSET[bits]) * scale``: int4 is
the symmetric grid -7..7 (scale = the block's largest magnitude / 7; code 0, -8, is never
written but decodes within bounds); int2 has no zero level, -1.5, -0.5, 0.5, 1.5 steps, with
the block's RMS as the step (the error-minimising step of a 4-level quantizer of Gaussian
values is about one standard deviation), so larger values are clipped to 1.5 steps: with
error feedback the clipped part is sent in later rounds. Pure tensor arithmetic, no I/O: the
codec validates the files.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

BLOCK = 128  # values per scale: 4 bytes of scale per 128 values, 1/32 byte per value
BITS = {"int4": 4, "int2": 2}
OFFSET = {4: 8.0, 2: 1.5}
_TOP = {4: 7.0, 2: 1.5}  # the largest level written


def packed_shapes(numel: int, bits: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(codes shape, scales shape)`` of a tensor of ``numel`` values at ``bits`` bits."""
    return (math.ceil(numel * bits / 8),), (math.ceil(numel / BLOCK),)


def quantize(value: Tensor, bits: int) -> tuple[Tensor, Tensor]:
    """``(packed uint8 codes, float32 scales)`` of a float32 CPU tensor."""
    flat = value.reshape(-1)
    blocks = torch.nn.functional.pad(flat, (0, -flat.numel() % BLOCK)).reshape(-1, BLOCK)
    if bits == 4:
        scale = blocks.abs().amax(dim=1) / _TOP[4]
    else:
        # the RMS over the block's real values (the padding is not data)
        counts = torch.full((blocks.shape[0],), float(BLOCK))
        if flat.numel() % BLOCK:
            counts[-1] = flat.numel() % BLOCK
        scale = (blocks.square().sum(dim=1) / counts).sqrt()
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))
    levels = blocks / divisor[:, None]
    if bits == 4:
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


def _pack(codes: Tensor, bits: int) -> Tensor:
    per_byte = 8 // bits
    codes = torch.nn.functional.pad(codes, (0, -codes.numel() % per_byte)).reshape(-1, per_byte)
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8)
    return (codes << shifts).sum(dim=1, dtype=torch.uint8).contiguous()


def _unpack(packed: Tensor, bits: int) -> Tensor:
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8)
    mask = (1 << bits) - 1
    return ((packed[:, None] >> shifts) & mask).reshape(-1)

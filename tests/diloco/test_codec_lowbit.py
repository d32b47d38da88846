"""int4 / int2 deltas: packed codes with per-block scales (``blockquant``), every tensor's in
one codes tensor and one scales tensor, their sizes, round trips within a step of the grid, and
the hostile files the codec must refuse (I4)."""

from __future__ import annotations

import pytest
import safetensors.torch
import torch

from speedtronic.distributed import blockquant
from speedtronic.distributed.codec import (
    PACKED_CODES,
    PACKED_SCALES,
    decode_delta,
    decode_own_delta,
    encode_delta,
    expected_delta_bytes,
)
from tests.diloco.test_codec import PATH, make_header, reject, resaved, small_delta


@pytest.fixture
def ref() -> dict[str, torch.Tensor]:
    """Weights with a tensor of several blocks and a ragged end, plus 1-D and 0-D ones."""
    gen = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(33, 10, generator=gen),  # 330 values: 3 blocks, ragged
        "ln.weight": torch.ones(7),
        "temperature": torch.tensor(0.5),
    }


def shapes_of(ref):
    return {key: tuple(value.shape) for key, value in ref.items()}


@pytest.mark.parametrize(("encoding", "share"), [("int4", 0.30), ("int2", 0.20)])
def test_low_bit_deltas_are_a_fraction_of_bf16s_bytes(encoding, share):
    ref = {"w": torch.zeros(512, 384), "b": torch.zeros(384)}
    bf16 = expected_delta_bytes(ref, "bf16")
    assert expected_delta_bytes(ref, encoding) <= share * bf16
    data = encode_delta(small_delta(ref), make_header(encoding))
    assert len(data) <= share * len(encode_delta(small_delta(ref), make_header("bf16")))


def blocks_of(stored, ref, key):
    """``key``'s scales in a packed file: every tensor's scales follow in sorted-name order."""
    at = 0
    for name in sorted(ref):
        n = -(-ref[name].numel() // 128)
        if name == key:
            return stored[PACKED_SCALES][at : at + n]
        at += n
    raise KeyError(key)


@pytest.mark.parametrize("encoding", ["int4", "int2"])
def test_low_bit_round_trip_keeps_shapes_and_stays_within_a_step(ref, encoding):
    delta = small_delta(ref)
    data = encode_delta(delta, make_header(encoding))
    header, decoded = decode_delta(data, PATH, ref)
    assert header.encoding == encoding
    stored = safetensors.torch.load(data)
    assert stored.keys() == {PACKED_CODES, PACKED_SCALES}
    assert stored[PACKED_CODES].dtype == torch.uint8
    for key, value in delta.items():
        assert decoded[key].shape == value.shape and decoded[key].dtype == torch.float32
        scales = blocks_of(stored, ref, key)
        flat, step = value.reshape(-1), scales.repeat_interleave(128)[: value.numel()]
        error = (decoded[key].reshape(-1) - flat).abs()
        if encoding == "int4":  # absmax scaling: nothing clipped, within half a step
            assert bool((error <= 0.5 * step + 1e-7).all())
        else:  # within half a step of the +-1.5-step grid, or clipped beyond it
            inside = flat.abs() <= 1.5 * step
            assert bool((error[inside] <= 0.5 * step[inside] + 1e-7).all())
        assert torch.equal(decode_own_delta(data, encoding, shapes_of(ref))[key], decoded[key])


def test_a_packed_file_decodes_the_same_whatever_the_order_of_the_names(ref):
    delta = small_delta(ref)
    reordered = dict(reversed(list(delta.items())))
    data = encode_delta(reordered, make_header("int4"))
    assert data == encode_delta(delta, make_header("int4"))
    _, decoded = decode_delta(data, PATH, ref)
    assert list(decoded) == list(ref)


def test_a_small_models_low_bit_file_is_not_mostly_header():
    # 18.5K values in 20 tensors, like the e2e test's model: one header entry per tensor
    # would be a tenth of an int4 file
    gen = torch.Generator().manual_seed(0)
    ref = {f"layer{i}.w": torch.randn(30, 30, generator=gen) for i in range(19)}
    ref["head"] = torch.randn(1400, generator=gen)
    bf16 = len(encode_delta(small_delta(ref), make_header("bf16")))
    for encoding, share in (("int4", 0.30), ("int2", 0.20)):
        assert len(encode_delta(small_delta(ref), make_header(encoding))) <= share * bf16


def test_int4_keeps_an_all_zero_block_exactly_zero(ref):
    delta = {key: torch.zeros_like(value) for key, value in ref.items()}
    _, decoded = decode_delta(encode_delta(delta, make_header("int4")), PATH, ref)
    assert all(bool((value == 0).all()) for value in decoded.values())


@pytest.mark.parametrize("bits", [4, 2])
def test_packing_puts_the_first_value_in_the_low_bits(bits):
    levels = torch.tensor([1.0, -1.0, 0.5, -0.5]) if bits == 2 else torch.tensor([1.0, -7.0])
    packed, scale = blockquant.quantize(levels * (7.0 if bits == 4 else 1.0) / 7.0, bits)
    assert packed.dtype == torch.uint8 and packed.numel() == 1
    decoded = blockquant.dequantize(packed, scale, (levels.numel(),), bits)
    assert torch.allclose(decoded.sign(), levels.sign())


# ---- I4: hostile low-bit files ------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["int4", "int2"])
@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_I4_rejects_a_negative_or_non_finite_scale(ref, encoding, bad):
    data = encode_delta(small_delta(ref), make_header(encoding))
    scales = safetensors.torch.load(data)[PACKED_SCALES].clone()
    scales[1] = bad
    reject(resaved(data, None, {PACKED_SCALES: scales}), ref, "negative, NaN or Inf scale")


def test_I4_rejects_codes_of_the_wrong_length(ref):
    data = encode_delta(small_delta(ref), make_header("int2"))
    short = torch.zeros(85, dtype=torch.uint8)  # 330, 7 and 1 values at 2 bits: 83 + 2 + 1 bytes
    reject(resaved(data, None, {PACKED_CODES: short}), ref, r"has shape \(85,\), expected \(86,\)")


def test_I4_rejects_codes_stored_as_another_dtype(ref):
    data = encode_delta(small_delta(ref), make_header("int4"))
    wrong = torch.zeros(165 + 4 + 1, dtype=torch.int8)
    reject(resaved(data, None, {PACKED_CODES: wrong}), ref, "has dtype 'I8', expected U8")


def test_I4_rejects_missing_scales(ref):
    data = encode_delta(small_delta(ref), make_header("int4"))
    reject(resaved(data, None, {PACKED_SCALES: None}), ref, f"missing tensor '{PACKED_SCALES}'")


def test_I4_rejects_scales_that_blow_the_norm(ref):
    data = encode_delta(small_delta(ref), make_header("int4"))
    huge = torch.full((5,), 1e30)
    reject(resaved(data, None, {PACKED_SCALES: huge}), ref, "implausible norm")


def test_I4_an_int4_header_over_bf16_bytes_is_refused(ref):
    data = resaved(encode_delta(small_delta(ref), make_header("bf16")), {"encoding": "int4"})
    reject(data, ref, "missing tensor 'embed.weight::scale'")  # read as the per-tensor layout


@pytest.mark.parametrize("layout", ["0123456789abcdef", None])
def test_I4_a_file_packed_for_other_tensors_is_refused_by_its_layout(ref, layout):
    # the same total sizes, cut at other places: only the layout tells
    data = encode_delta(small_delta(ref), make_header("int2"))
    reject(resaved(data, {"layout": layout}), ref, "packed for other tensor names or shapes")


def test_I4_a_model_with_the_same_sizes_in_other_shapes_is_refused(ref):
    other = {**ref, "embed.weight": torch.zeros(10, 33)}
    data = encode_delta(small_delta(other), make_header("int4"))
    reject(data, ref, "packed for other tensor names or shapes")


# ---- the layout before packing: a node of the previous version, a checkpoint's record -----


def per_tensor_file(delta, encoding, scale_of=None):
    """An int4 / int2 delta as the version before the packed layout wrote it."""
    bits, tensors = blockquant.BITS[encoding], {}
    for key, value in delta.items():
        tensors[key], tensors[key + "::scale"] = blockquant.quantize(value.float(), bits)
    tensors.update(scale_of or {})
    return safetensors.torch.save(tensors, metadata=make_header(encoding).to_metadata())


@pytest.mark.parametrize("encoding", ["int4", "int2"])
def test_a_delta_in_the_layout_before_packing_decodes_to_the_same_values(ref, encoding):
    # a fleet upgrades a node at a time: an older worker's deltas must still count (I1)
    delta = small_delta(ref)
    _, packed = decode_delta(encode_delta(delta, make_header(encoding)), PATH, ref)
    old = per_tensor_file(delta, encoding)
    _, decoded = decode_delta(old, PATH, ref)
    assert all(torch.equal(decoded[k], packed[k]) for k in ref)
    own = decode_own_delta(old, encoding, shapes_of(ref))  # an in-flight record of a checkpoint
    assert all(torch.equal(own[k], packed[k]) for k in ref)


def test_I4_a_delta_in_the_layout_before_packing_is_checked_like_any(ref):
    negative = torch.full((3,), -1.0)
    old = per_tensor_file(small_delta(ref), "int4", {"embed.weight::scale": negative})
    reject(old, ref, "'embed.weight::scale' has a negative, NaN or Inf scale")

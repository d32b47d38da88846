"""DumbDiLoCo codec: pseudo-gradient, delta/weights round trips, and one test per bad delta (I4).

Deltas come from untrusted collaborators, so every way a file can be wrong has its own test
named after the invariant: rejected with a one-line BadDelta, before tensors are loaded when
the header already tells, and never unpickled. Tensors are tiny; the whole file runs in seconds.
"""

from __future__ import annotations

import json
import os
import pickle
import struct

import pytest
import safetensors.torch
import torch

from speedtronic.distributed import codec, protocol
from speedtronic.distributed.codec import (
    BadDelta,
    decode_delta,
    decode_weights,
    encode_delta,
    encode_weights,
    expected_delta_bytes,
    pseudo_gradient,
)
from speedtronic.distributed.protocol import DeltaHeader, delta_path

PATH = delta_path("node-a", 3)


@pytest.fixture
def ref() -> dict[str, torch.Tensor]:
    """Global weights shaped like a tiny model: 2-D, 1-D and 0-D tensors."""
    gen = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(6, 4, generator=gen),
        "ln.weight": torch.ones(4),
        "head.bias": torch.randn(3, generator=gen),
        "temperature": torch.tensor(0.5),
    }


def small_delta(ref, scale=0.01, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return {key: scale * torch.randn(value.shape, generator=gen) for key, value in ref.items()}


def make_header(encoding="bf16", **changes) -> DeltaHeader:
    fields = dict(node_id="node-a", seq=3, base_outer_step=1, steps=50, tokens=6400)
    return DeltaHeader(
        encoding=encoding, created_at="2025-01-02T03:04:05+00:00", **fields | changes
    )


def metadata_of(data: bytes) -> dict:
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length])["__metadata__"]


def raw_file(header: dict, payload: bytes) -> bytes:
    """Safetensors bytes with a hand-written header, for layouts the library refuses to write."""
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + payload


def reject(data, ref, match, path=PATH, **kwargs) -> BadDelta:
    with pytest.raises(BadDelta, match=match) as info:
        decode_delta(data, path, ref, **kwargs)
    assert "\n" not in str(info.value)
    return info.value


# ---- pseudo-gradient and round trips ------------------------------------------------------


def test_pseudo_gradient_sign_and_value_is_base_minus_current():
    base = {"w": torch.ones(2, 2)}
    current = {"w": torch.full((2, 2), 0.75)}
    delta = pseudo_gradient(base, current)
    assert delta["w"].dtype == torch.float32 and delta["w"].device.type == "cpu"
    assert torch.equal(delta["w"], torch.full((2, 2), 0.25))


def test_pseudo_gradient_is_float32_for_bf16_weights():
    delta = pseudo_gradient({"w": torch.ones(3, dtype=torch.bfloat16)}, {"w": torch.zeros(3)})
    assert delta["w"].dtype == torch.float32 and torch.equal(delta["w"], torch.ones(3))


def test_pseudo_gradient_refuses_mismatched_keys_or_shapes():
    with pytest.raises(ValueError, match="keys"):
        pseudo_gradient({"a": torch.zeros(1)}, {"b": torch.zeros(1)})
    with pytest.raises(ValueError, match="shapes"):
        pseudo_gradient({"a": torch.zeros(2)}, {"a": torch.zeros(3)})


def test_fp32_round_trip_is_exact(ref):
    delta = small_delta(ref)
    header, decoded = decode_delta(encode_delta(delta, make_header("fp32")), PATH, ref)
    assert header == make_header("fp32")
    assert decoded.keys() == delta.keys()
    assert all(torch.equal(decoded[k], delta[k]) for k in delta)


def test_bf16_round_trip_is_within_bf16_precision(ref):
    delta = small_delta(ref)
    _, decoded = decode_delta(encode_delta(delta, make_header("bf16")), PATH, ref)
    for key, value in delta.items():
        assert decoded[key].dtype == torch.float32
        assert torch.equal(decoded[key], value.bfloat16().float())
        # bf16 keeps 8 significant bits: round-to-nearest errs by at most 2**-8 relative.
        assert torch.all((decoded[key] - value).abs() <= value.abs() * 2**-8)


def test_int8_round_trip_is_within_half_a_step_per_row(ref):
    delta = small_delta(ref)
    delta["embed.weight"][2] = 0.0  # an all-zero row must come back exactly
    delta["embed.weight"][4] *= 100  # one loud row must not cost the others precision
    _, decoded = decode_delta(encode_delta(delta, make_header("int8")), PATH, ref)
    for key, value in delta.items():
        rows = value.reshape(value.shape[0], -1) if value.dim() >= 2 else value.reshape(1, -1)
        step = rows.abs().amax(dim=1, keepdim=True) / 127
        error = (decoded[key].reshape(rows.shape) - rows).abs()
        assert torch.all(error <= step / 2 + 1e-9), key
    assert torch.equal(decoded["embed.weight"][2], torch.zeros(4))


def test_int8_stores_int8_values_and_one_float32_scale_per_row(ref):
    stored = safetensors.torch.load(encode_delta(small_delta(ref), make_header("int8")))
    assert stored["embed.weight"].dtype == torch.int8
    assert stored["embed.weight::scale"].shape == (6,)
    assert stored["embed.weight::scale"].dtype == torch.float32
    assert stored["head.bias::scale"].shape == (1,)  # 0-/1-D tensors: one per-tensor scale
    assert stored["temperature::scale"].shape == (1,)


def test_encoded_bf16_delta_is_half_the_bytes_of_fp32():
    ref = {f"layer{i}.weight": torch.randn(256, 256) for i in range(3)} | {"bias": torch.zeros(256)}
    delta = small_delta(ref)
    fp32 = encode_delta(delta, make_header("fp32"))
    bf16 = encode_delta(delta, make_header("bf16"))
    assert abs(len(bf16) / len(fp32) - 0.5) <= 0.02
    assert expected_delta_bytes(ref, "fp32") < len(fp32) < expected_delta_bytes(ref, "fp32") + 4096


def test_expected_delta_bytes_per_encoding(ref):
    numel, rows = 24 + 4 + 3 + 1, 6 + 1 + 1 + 1
    assert expected_delta_bytes(ref, "fp32") == 4 * numel
    assert expected_delta_bytes(ref, "bf16") == 2 * numel
    assert expected_delta_bytes(ref, "int8") == numel + 4 * rows


def test_int8_encoding_refuses_a_tensor_name_reserved_for_scales():
    with pytest.raises(ValueError, match="reserved"):
        encode_delta({"w::scale": torch.zeros(2)}, make_header("int8"))


def test_I4_accepts_an_all_zero_delta(ref):
    # Harmless by design: it cannot move the weights; a worker whose weights did not change
    # (lr 0 in warm-up) sends exactly this, so it must not be counted as a bad delta.
    zeros = {key: torch.zeros_like(value) for key, value in ref.items()}
    _, decoded = decode_delta(encode_delta(zeros, make_header()), PATH, ref)
    assert all(torch.equal(decoded[k], zeros[k]) for k in ref)


def test_bad_delta_is_one_class_for_protocol_and_codec():
    assert codec.BadDelta is protocol.BadDelta


# ---- I4: not safetensors ------------------------------------------------------------------


def test_I4_rejects_random_bytes(ref):
    reject(os.urandom(4096), ref, "not a safetensors file|implausible size")
    reject(b"\x10" + b"\x00" * 7 + os.urandom(100), ref, "not a safetensors file")


_unpickled = []


class _Tripwire:
    def __reduce__(self):
        return (_unpickled.append, ("unpickled!",))


def test_I4_rejects_a_pickle_file_without_unpickling_it(ref, tmp_path):
    reject(pickle.dumps({"embed.weight": _Tripwire()}), ref, "not a safetensors file")
    torch.save(small_delta(ref), tmp_path / "delta.pt")
    reject((tmp_path / "delta.pt").read_bytes(), ref, "not a safetensors file|implausible size")
    assert _unpickled == []


def test_I4_rejects_an_empty_file(ref):
    reject(b"", ref, "not a safetensors file")


def test_I4_rejects_truncated_file(ref):
    data = encode_delta(small_delta(ref), make_header())
    reject(data[:-5], ref, "tensor data is .* bytes")
    reject(data[:20], ref, "not a safetensors file: header length")
    reject(data[:5], ref, "not a safetensors file")


@pytest.mark.parametrize("length", [0, 1, 10**6, 2**63, 2**64 - 1])
def test_I4_rejects_a_header_length_that_does_not_fit(ref, length):
    data = encode_delta(small_delta(ref), make_header())
    reject(struct.pack("<Q", length) + data[8:], ref, "header length")


def test_I4_rejects_a_header_that_is_not_json(ref):
    reject(struct.pack("<Q", 8) + b"{not js}" + b"\x00" * 16, ref, "header is not JSON")
    reject(struct.pack("<Q", 8) + b"\xff\xfe{}    ", ref, "header is not JSON")
    deep = b"[" * 50_000  # json.loads recurses: this would raise RecursionError unhandled
    reject(struct.pack("<Q", len(deep)) + deep, ref, "header is not JSON")
    reject(raw_file([1, 2], b""), ref, "not a JSON object")


def test_I4_checks_the_header_before_loading_tensors(ref, monkeypatch):
    calls = []
    real_load = safetensors.torch.load

    def load_spy(data):
        calls.append(len(data))
        return real_load(data)

    monkeypatch.setattr(safetensors.torch, "load", load_spy)
    delta = small_delta(ref)
    delta["embed.weight"] = torch.zeros(4, 6)
    reject(encode_delta(delta, make_header()), ref, "shape")
    assert calls == []
    decode_delta(encode_delta(small_delta(ref), make_header()), PATH, ref)
    assert len(calls) == 1  # the spy is really in the path


# ---- I4: header metadata ------------------------------------------------------------------


def resaved(data: bytes, meta_changes=None, tensor_changes=None) -> bytes:
    """A delta re-written with some metadata and/or tensors replaced (None removes)."""
    tensors = safetensors.torch.load(data)
    meta = metadata_of(data)
    for changes, target in ((meta_changes, meta), (tensor_changes, tensors)):
        for key, value in (changes or {}).items():
            if value is None:
                target.pop(key)
            else:
                target[key] = value
    return safetensors.torch.save(tensors, metadata=meta)


def test_I4_rejects_missing_header_metadata(ref):
    tensors = safetensors.torch.load(encode_delta(small_delta(ref), make_header()))
    reject(safetensors.torch.save(tensors), ref, "header metadata missing|header format")


@pytest.mark.parametrize("fmt", ["speedtronic-delta-0", "speedtronic-global-1", None])
def test_I4_rejects_wrong_header_format(ref, fmt):
    data = resaved(encode_delta(small_delta(ref), make_header()), {"format": fmt})
    reject(data, ref, "header format")


def test_I4_rejects_metadata_that_is_not_a_string_map(ref):
    header = {"__metadata__": {"format": protocol.DELTA_FORMAT, "seq": 3}}
    reject(raw_file(header, b""), ref, "metadata is not a map of strings")


@pytest.mark.parametrize(
    ("field", "text"), [("tokens", "1.5"), ("seq", "-3"), ("steps", "ten"), ("base_outer_step", "")]
)
def test_I4_rejects_non_integer_header_fields(ref, field, text):
    data = resaved(encode_delta(small_delta(ref), make_header()), {field: text})
    reject(data, ref, f"header {field} .*integer")


def test_I4_rejects_header_node_id_contradicting_its_path(ref):
    data = encode_delta(small_delta(ref), make_header(node_id="node-b"))
    reject(data, ref, "header node_id 'node-b' contradicts path node 'node-a'")


def test_I4_rejects_header_seq_contradicting_its_path(ref):
    data = encode_delta(small_delta(ref), make_header(seq=4))
    reject(data, ref, "header seq 4 contradicts path seq 3")


@pytest.mark.parametrize("node_id", ["../x", "a/b", "abc\n", ".", "", "x" * 65])
def test_I4_rejects_header_node_id_that_is_not_path_safe(ref, node_id):
    data = resaved(encode_delta(small_delta(ref), make_header()), {"node_id": node_id})
    reject(data, ref, "header node_id")


@pytest.mark.parametrize(
    "path", ["nodes/../delta_00000003.safetensors", "nodes/node-a/delta_3.bin", "x"]
)
def test_I4_rejects_a_path_that_is_not_a_delta_path(ref, path):
    data = encode_delta(small_delta(ref), make_header())
    reject(data, ref, "is not nodes/<node_id>/delta_<seq>.safetensors", path=path)


# ---- I4: tensors --------------------------------------------------------------------------


def test_I4_rejects_a_missing_key(ref):
    delta = small_delta(ref)
    del delta["head.bias"]
    reject(encode_delta(delta, make_header()), ref, "missing tensor 'head.bias'")


def test_I4_rejects_a_missing_int8_scale(ref):
    data = resaved(
        encode_delta(small_delta(ref), make_header("int8")), None, {"ln.weight::scale": None}
    )
    reject(data, ref, "missing tensor 'ln.weight::scale'")


def test_I4_rejects_an_extra_key(ref):
    delta = small_delta(ref) | {"backdoor": torch.zeros(2)}
    reject(encode_delta(delta, make_header()), ref, "unexpected tensor 'backdoor'")


def test_I4_rejects_a_wrong_shape(ref):
    delta = small_delta(ref) | {"embed.weight": torch.zeros(4, 6)}
    reject(
        encode_delta(delta, make_header()),
        ref,
        r"'embed.weight' has shape \(4, 6\), expected \(6, 4\)",
    )


@pytest.mark.parametrize(
    ("declared", "stored", "match"),
    [
        ("bf16", torch.float32, "has dtype 'F32', expected BF16"),
        ("fp32", torch.bfloat16, "has dtype 'BF16', expected F32"),
        ("fp32", torch.float64, "has dtype 'F64', expected F32"),
        ("int8", torch.float32, "has dtype 'F32', expected I8"),
    ],
)
def test_I4_rejects_a_dtype_the_encoding_does_not_imply(ref, declared, stored, match):
    data = encode_delta(small_delta(ref), make_header(declared))
    tensor = small_delta(ref)["ln.weight"].to(stored)
    reject(resaved(data, None, {"ln.weight": tensor}), ref, match)


@pytest.mark.parametrize("encoding", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_I4_rejects_nan_and_inf(ref, encoding, bad):
    delta = small_delta(ref)
    delta["embed.weight"][1, 2] = bad
    reject(encode_delta(delta, make_header(encoding)), ref, "'embed.weight' has NaN or Inf")


def test_I4_rejects_inf_from_an_overflowing_int8_scale(ref):
    data = encode_delta(small_delta(ref), make_header("int8"))
    huge = {"embed.weight::scale": torch.full((6,), 3e38)}
    reject(resaved(data, None, huge), ref, "'embed.weight' has NaN or Inf")


def test_I4_rejects_overlapping_data_offsets(ref):
    data = encode_delta(small_delta(ref), make_header("fp32"))
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    header["head.bias"]["data_offsets"] = header["embed.weight"]["data_offsets"][:1] + [12]
    reject(raw_file(header, data[8 + length :]), ref, "data offsets")


def test_I4_rejects_an_implausibly_large_file(ref):
    data = encode_delta(small_delta(ref), make_header("fp32"))
    reject(data + b"\x00" * (200 << 10), ref, "implausible size")


def test_I4_size_limit_follows_the_declared_encoding():
    # 190 KB is plausible for an fp32 delta of this reference (256 KiB), not for an int8 one.
    ref = {"w": torch.randn(256, 256)}
    data = encode_delta(small_delta(ref), make_header("int8"))
    padded = resaved(data, None, {"pad": torch.zeros(30_000)})
    assert expected_delta_bytes(ref, "int8") < len(padded) < expected_delta_bytes(ref, "fp32")
    reject(padded, ref, "implausible size")


def test_I4_rejects_an_implausible_norm(ref):
    reject(encode_delta(small_delta(ref, scale=100.0), make_header()), ref, "implausible norm")
    twice = {key: 2 * value for key, value in ref.items()}
    decode_delta(encode_delta(twice, make_header("fp32")), PATH, ref)  # 2x passes the default 10x
    reject(encode_delta(twice, make_header("fp32")), ref, "implausible norm", max_norm_ratio=1.5)


# ---- global weights -----------------------------------------------------------------------


def test_weights_round_trip_is_exact_with_the_outer_step(ref):
    outer_step, weights = decode_weights(encode_weights(ref, 17), ref)
    assert outer_step == 17
    assert list(weights) == list(ref) and all(torch.equal(weights[k], ref[k]) for k in ref)


def test_encode_weights_handles_tied_weights_and_bf16():
    shared = torch.randn(4, 2)
    state = {
        "embed.weight": shared,
        "head.weight": shared,
        "ln": torch.ones(2, dtype=torch.bfloat16),
    }
    _, weights = decode_weights(encode_weights(state, 0), state)
    assert weights["ln"].dtype == torch.float32 and torch.equal(weights["head.weight"], shared)


@pytest.mark.parametrize("outer_step", [-1, True, 1.5])
def test_encode_weights_refuses_a_bad_outer_step(ref, outer_step):
    with pytest.raises(ValueError, match="outer_step"):
        encode_weights(ref, outer_step)


def weights_with(ref, meta_changes=None, tensor_changes=None) -> bytes:
    return resaved(encode_weights(ref, 5), meta_changes, tensor_changes)


@pytest.mark.parametrize(
    ("meta", "tensors", "match"),
    [
        ({"outer_step": "-1"}, None, "outer_step .*integer >= 0"),
        ({"outer_step": "1e3"}, None, "outer_step .*integer >= 0"),
        ({"outer_step": None}, None, "outer_step .*integer >= 0"),
        ({"format": protocol.DELTA_FORMAT}, None, "weights format"),
        (None, {"ln.weight": None}, "missing tensor 'ln.weight'"),
        (None, {"extra": torch.zeros(1)}, "unexpected tensor 'extra'"),
        (None, {"ln.weight": torch.ones(5)}, r"shape \(5,\), expected \(4,\)"),
        (None, {"ln.weight": torch.ones(4, dtype=torch.bfloat16)}, "dtype 'BF16'"),
        (None, {"ln.weight": torch.tensor([1.0, float("nan"), 1.0, 1.0])}, "NaN or Inf"),
    ],
)
def test_I4_decode_weights_rejects_bad_files(ref, meta, tensors, match):
    with pytest.raises(BadDelta, match=match):
        decode_weights(weights_with(ref, meta, tensors), ref)


def test_I4_decode_weights_rejects_non_safetensors_and_oversized_files(ref):
    for data in (b"", os.urandom(64), pickle.dumps(ref)):
        with pytest.raises(BadDelta, match="not a safetensors file"):
            decode_weights(data, ref)
    with pytest.raises(BadDelta, match="implausible size"):
        decode_weights(encode_weights(ref, 1) + b"\x00" * (200 << 10), ref)

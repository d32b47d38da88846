"""DumbDiLoCo protocol: shared-repo names, path-safe node ids and the delta header parser (I4).

Everything here is stdlib-only and runs in milliseconds; the byte-level checks of delta files
are in test_diloco_codec.py.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from speedtronic.distributed import protocol
from speedtronic.distributed.protocol import (
    DELTA_FORMAT,
    BadDelta,
    DeltaHeader,
    check_node_id,
    delta_path,
    parse_delta_path,
)

UNSAFE_NODE_IDS = [
    "../x",
    "a/b",
    "abc\n",
    ".",
    "..",
    "",
    "x" * 65,
    ".hidden",
    "-rf",
    "a b",
    "a\\b",
    "a\x00b",
    "nod\u00e9",
]


def make_header(**changes) -> DeltaHeader:
    fields = dict(
        node_id="node-a",
        seq=7,
        base_outer_step=2,
        steps=50,
        tokens=12800,
        encoding="bf16",
        created_at="2025-01-02T03:04:05+00:00",
    )
    return DeltaHeader(**{**fields, **changes})


def test_protocol_is_stdlib_only():
    tree = ast.parse(Path(protocol.__file__).read_text(encoding="utf-8"))
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not {name.split(".")[0] for name in imported} & {"torch", "safetensors", "numpy"}


@pytest.mark.parametrize("node_id", ["node-a", "a", "A.b_c-9", "7", "x" * 64, "a..b"])
def test_I4_check_node_id_accepts_path_safe_names(node_id):
    assert check_node_id(node_id) == node_id


@pytest.mark.parametrize("node_id", UNSAFE_NODE_IDS + [None, 5])
def test_I4_check_node_id_refuses_names_that_are_not_path_safe(node_id):
    with pytest.raises(ValueError, match="node_id .*: must"):
        check_node_id(node_id)


def test_delta_path_is_the_documented_layout():
    assert delta_path("node-a", 7) == "nodes/node-a/delta_00000007.safetensors"
    assert protocol.GLOBAL_WEIGHTS == "global/latest.safetensors"
    assert protocol.STEP_COUNT == "global/step_count.json"


@pytest.mark.parametrize("seq", [0, 7, 99_999_999, 123_456_789])
def test_parse_delta_path_inverts_delta_path(seq):
    assert parse_delta_path(delta_path("node-a", seq)) == ("node-a", seq)


@pytest.mark.parametrize("node_id", UNSAFE_NODE_IDS)
def test_I4_delta_path_refuses_unsafe_node_ids(node_id):
    with pytest.raises(ValueError):
        delta_path(node_id, 1)


@pytest.mark.parametrize("seq", [-1, True, 1.0, "1"])
def test_delta_path_refuses_a_seq_that_is_not_a_count(seq):
    with pytest.raises(ValueError, match="seq"):
        delta_path("node-a", seq)


@pytest.mark.parametrize(
    "path",
    [
        "nodes/../delta_00000001.safetensors",
        "nodes/./delta_00000001.safetensors",
        "nodes/a/b/delta_00000001.safetensors",
        "nodes/a\n/delta_00000001.safetensors",
        "nodes//delta_00000001.safetensors",
        "nodes/.hidden/delta_00000001.safetensors",
        "./nodes/a/delta_00000001.safetensors",
        "/nodes/a/delta_00000001.safetensors",
        "Nodes/a/delta_00000001.safetensors",
        "nodes\\a\\delta_00000001.safetensors",
        "nodes/a/delta_1234567890123456789.safetensors",  # past 2**63
        "nodes/a/delta_-0000001.safetensors",
        "nodes/a/delta_00000001.safetensors.tmp",
        "nodes/a/delta_00000001.pt",
        "nodes/a/delta_00000001.safetensors\n",
        "global/latest.safetensors",
        "",
        None,
    ],
)
def test_I4_parse_delta_path_refuses_anything_else(path):
    assert parse_delta_path(path) is None


@pytest.mark.parametrize(
    "path, parsed",
    [
        ("nodes/a/delta_1.safetensors", ("a", 1)),
        ("nodes/evil/delta_500.safetensors", ("evil", 500)),  # upstream's delta_<local_step>
        ("nodes/a/delta_000000001.safetensors", ("a", 1)),  # identity is content: no alias
    ],
)
def test_I4_any_delta_digits_name_is_a_delta_so_a_corrupt_one_is_rejected_by_name(path, parsed):
    assert parse_delta_path(path) == parsed and protocol.delta_path_problem(path) is None


@pytest.mark.parametrize(
    "path, reason",
    [
        ("nodes/stray.bin", "not inside a node's folder"),
        ("nodes/.x/delta_1.safetensors", "is not a valid node id"),
        ("nodes/a/b/delta_1.safetensors", "nested below"),
        ("nodes/a/notes.txt", "not named delta_<digits>.safetensors"),
    ],
)
def test_I4_a_path_that_is_no_delta_has_a_reason_to_log(path, reason):
    assert reason in protocol.delta_path_problem(path)


def test_header_round_trips_through_string_metadata():
    header = make_header()
    meta = header.to_metadata()
    assert meta["format"] == DELTA_FORMAT
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())
    assert DeltaHeader.from_metadata(meta) == header


def test_header_ignores_unknown_extra_keys():
    meta = {**make_header().to_metadata(), "comment": "added by a later version"}
    assert DeltaHeader.from_metadata(meta) == make_header()


@pytest.mark.parametrize("meta", [None, {}, "format=speedtronic-delta-1"])
def test_I4_header_rejects_missing_metadata(meta):
    with pytest.raises(BadDelta, match="header"):
        DeltaHeader.from_metadata(meta)


@pytest.mark.parametrize("fmt", [None, "speedtronic-delta-2", "speedtronic-global-1", ""])
def test_I4_header_rejects_wrong_format(fmt):
    meta = make_header().to_metadata()
    if fmt is None:
        del meta["format"]
    else:
        meta["format"] = fmt
    with pytest.raises(BadDelta, match="format"):
        DeltaHeader.from_metadata(meta)


OPTIONAL = ("chain", "final", "end_step")  # later revisions of delta-1: older nodes omit them
REQUIRED = [f.name for f in dataclasses.fields(DeltaHeader) if f.name not in OPTIONAL]


@pytest.mark.parametrize("field", REQUIRED)
def test_I4_header_rejects_a_missing_field(field):
    meta = make_header().to_metadata()
    del meta[field]
    with pytest.raises(BadDelta, match=f"missing {field}"):
        DeltaHeader.from_metadata(meta)


@pytest.mark.parametrize("field", ["seq", "base_outer_step", "steps", "tokens"])
@pytest.mark.parametrize("text", ["-1", "1.5", " 1", "+1", "1_000", "0x10", "ten", "", "9" * 19])
def test_I4_header_rejects_non_integer_fields(field, text):
    meta = {**make_header().to_metadata(), field: text}
    with pytest.raises(BadDelta, match=f"{field} .*must be an integer >= 0"):
        DeltaHeader.from_metadata(meta)


@pytest.mark.parametrize("node_id", UNSAFE_NODE_IDS)
def test_I4_header_rejects_a_node_id_that_is_not_path_safe(node_id):
    meta = {**make_header().to_metadata(), "node_id": node_id}
    with pytest.raises(BadDelta, match="node_id"):
        DeltaHeader.from_metadata(meta)


@pytest.mark.parametrize(
    ("field", "text"),
    [("encoding", "fp16"), ("encoding", "pickle"), ("created_at", ""), ("created_at", "a\nb")],
)
def test_I4_header_rejects_bad_string_fields(field, text):
    meta = {**make_header().to_metadata(), field: text}
    with pytest.raises(BadDelta, match=field):
        DeltaHeader.from_metadata(meta)


def test_I4_header_messages_are_one_line():
    meta = {**make_header().to_metadata(), "node_id": "evil\nINFO: all good" + "x" * 200}
    with pytest.raises(BadDelta) as info:
        DeltaHeader.from_metadata(meta)
    assert "\n" not in str(info.value) and len(str(info.value)) < 300


@pytest.mark.parametrize(
    "changes",
    [{"seq": -1}, {"tokens": True}, {"steps": 1.0}, {"encoding": "fp16"}, {"node_id": "a/b"}],
)
def test_header_construction_refuses_invalid_values(changes):
    with pytest.raises(ValueError):
        make_header(**changes)


def test_a_header_without_a_chain_is_one_chain_and_a_bad_chain_is_refused():
    meta = make_header().to_metadata()
    assert "chain" not in meta and DeltaHeader.from_metadata(meta).chain == ""
    assert DeltaHeader.from_metadata({**meta, "chain": "0123abcd"}).chain == "0123abcd"
    for bad in ("x", "ABCDEF01", "0123abcd/../", "0" * 33):
        with pytest.raises(BadDelta, match="chain"):
            DeltaHeader.from_metadata({**meta, "chain": bad})

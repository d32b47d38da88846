"""DumbDiLoCo under a damaged or hostile repo (issue 17): strangers under ``nodes/``, every field
of ``step_count.json``, and what the master and workers do about them. Named after the
invariants of DESIGN.md section 5 they hold."""

from __future__ import annotations

import json
import os

import pytest
from diloco_support import Log
from test_diloco_nodes import master_loop

from speedtronic.distributed.protocol import STEP_COUNT, parse_step_count
from speedtronic.distributed.transport import LocalTransport
from speedtronic.errors import TransportError


def strangers_repo(root):
    """A repo whose ``nodes/`` holds one of every kind of entry that is no delta."""
    nodes = root / "nodes"
    (nodes / "node-a").mkdir(parents=True)
    (nodes / "node-a" / "notes.txt").write_text("hi")
    (nodes / "node-a" / "sub").mkdir()
    (nodes / "node-a" / "delta_00000009.safetensors").symlink_to("/etc/passwd")
    os.mkfifo(nodes / "node-a" / "delta_00000010.safetensors")
    (nodes / "stray.bin").write_bytes(b"x")
    (nodes / ".hidden").mkdir()
    (nodes / ".hidden" / "delta_1.safetensors").write_bytes(b"x")
    return LocalTransport(root)


def test_I4_a_directory_listing_names_every_stranger_with_its_reason(tmp_path):
    refs = strangers_repo(tmp_path).list_deltas()
    assert {r.path: r.problem for r in refs} == {
        "nodes/node-a/notes.txt": "not named delta_<digits>.safetensors",
        "nodes/node-a/sub": "a folder",
        "nodes/node-a/delta_00000009.safetensors": "a symbolic link",
        "nodes/node-a/delta_00000010.safetensors": "not a regular file",
        "nodes/stray.bin": "not inside a node's folder",
        "nodes/.hidden/delta_1.safetensors": "the folder '.hidden' is not a valid node id",
    }


def test_I4_the_master_logs_each_stranger_once_by_name_and_never_reads_it(tmp_path):
    transport, log = strangers_repo(tmp_path / "repo"), Log()
    loop = master_loop(tmp_path, transport, log)
    loop.start()
    for _ in range(3):
        loop.poll_once()
    ignored = [w for w in log.warnings if "ignoring" in w]
    assert len(ignored) == 6 and any("nodes/stray.bin: not inside" in w for w in ignored)
    assert loop.counters["found"] == 0 and loop.counters["rejected"] == 0


def test_I4_a_corrupt_delta_under_any_digits_name_is_rejected_by_name(tmp_path):
    transport, log = LocalTransport(tmp_path / "repo"), Log()
    loop = master_loop(tmp_path, transport, log)
    loop.start()
    transport.upload("nodes/evil/delta_500.safetensors", b"\x07" * 70)
    loop.poll_once()
    assert any("rejected nodes/evil/delta_500.safetensors" in w for w in log.warnings)
    assert loop.counters["rejected"] == 1


GOOD = {"outer_step": 3, "updated_at": "2026-01-01T00:00:00Z", "weights_sha256": "a" * 64}


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"nodes": [1]}, "nodes: must be an object"),
        ({"nodes": {"a": [1]}}, "must be a node id with an object"),
        ({"nodes": {"../x": {}}}, "must be a node id"),
        ({"nodes": {"a": {"seq": "1"}}}, "nodes.a.seq '1': must be an integer"),
        ({"fleet_tokens": "x"}, "fleet_tokens 'x': must be an integer"),
        ({"fleet_tokens": -1}, "fleet_tokens -1"),
        ({"outer_step": True}, "outer_step True"),
        ({"outer_step": 2**63}, "must be below 2**63"),
        ({"weights_sha256": "zz"}, "weights_sha256"),
        ({"updated_at": {"a": 1}}, "updated_at"),
    ],
)
def test_I4_every_step_count_field_is_type_and_range_checked(change, reason):
    with pytest.raises(TransportError, match=reason.replace("*", r"\*")) as info:
        parse_step_count(json.dumps({**GOOD, **change}).encode())
    assert str(info.value).startswith(STEP_COUNT)


def test_step_count_keeps_known_fields_and_drops_unknown_ones():
    nodes = {"a": {"seq": 1, "base_outer_step": 2, "tokens": 3, "last_delta_at": "t"}}
    parsed = parse_step_count(json.dumps({**GOOD, "nodes": nodes, "later": [1]}).encode())
    assert parsed == {**GOOD, "nodes": nodes}

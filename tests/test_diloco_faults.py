"""DumbDiLoCo under a damaged or hostile repo (issue 17): strangers under ``nodes/``, every field
of ``step_count.json``, and what the master and workers do about them. Named after the
invariants of DESIGN.md section 5 they hold."""

from __future__ import annotations

import json
import os

import pytest
from diloco_support import Log
from test_diloco_nodes import master_loop
from test_diloco_outer import assert_weights, make_delta
from test_diloco_outer import master as outer_master

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


# ---- I2: a node's consecutive deltas add up ------------------------------------------------


def chained(node: str, n: int, step: float, chain: str = "c0ffee00"):
    """``n`` consecutive deltas of one node's chain, each moving every weight by ``step``."""
    return [make_delta(node, seq, 0, 10, [step, step], [step], chain) for seq in range(1, n + 1)]


def test_I2_a_round_adds_up_one_nodes_consecutive_deltas_instead_of_averaging_them():
    """The issue's reproduction: a paused master finds 40 deltas of its only node."""
    m = outer_master(min_deltas=1, outer_lr=1.0, outer_momentum=0.0)
    for delta in chained("n1", 40, 0.01):
        assert m.offer(delta, now=0.0) == "accepted"
    result = m.round(now=0.0)
    assert result.counts["included"] == 40
    # All forty increments: w -= 40 * 0.01 = 0.4 (their mean would have moved 0.01).
    assert_weights(result.weights, {"a": [0.6, 1.6], "b": [0.1]})


def test_I2_nodes_are_averaged_with_each_other_after_each_nodes_increments_add_up():
    m = outer_master(min_deltas=1, outer_lr=1.0, outer_momentum=0.0)
    for delta in chained("n1", 3, 0.1) + chained("n2", 1, 0.5, chain="0badcafe"):
        m.offer(delta, now=0.0)
    # n1 moved 0.3 in three loops, n2 0.5 in one: equal per-loop tokens, so the fleet's
    # step is their mean, 0.4.
    assert_weights(m.round(now=0.0).weights, {"a": [0.6, 1.6], "b": [0.1]})


def test_I2_a_partial_round_applies_the_summed_node_at_its_share_of_the_fleet():
    m = outer_master(min_deltas=1, outer_lr=1.0, outer_momentum=0.0)
    m.offer(make_delta("n1", 1, 0, 10, [0.0, 0.0], [0.0], "c0ffee00"), now=0.0)
    m.offer(make_delta("n2", 1, 0, 10, [0.0, 0.0], [0.0], "0badcafe"), now=0.0)
    m.round(now=0.0)  # both nodes are the fleet now
    for delta in chained("n1", 4, 0.1)[1:]:  # n1's next three loops, while n2 is away
        m.offer(delta, now=1.0)
    # n1 is half the fleet: its 0.3 counts half, 0.15.
    assert_weights(m.round(now=1.0).weights, {"a": [0.85, 1.85], "b": [0.35]})

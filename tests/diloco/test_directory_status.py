"""``storage status`` of a directory run (issue 48): what it shows of a bucket (outer step, a
round's bytes, each node's newest delta), read from a shared directory; ``hub status`` of a path
points to it."""

from __future__ import annotations

import json

from cli.test_cli import assert_one_line_error, invoke

from speedtronic.distributed.protocol import delta_path, keyframe_path
from speedtronic.distributed.transport import LocalTransport


def test_storage_status_reads_a_shared_directory(tmp_path):
    repo = LocalTransport(tmp_path / "run")
    repo.upload(keyframe_path(0, "a" * 64), b"k" * 300)
    repo.publish(b"u" * 80, {"outer_step": 2, "updated_at": "2026-01-01T00:00:00Z"}, [])
    repo.upload(delta_path("worker-1", 1), b"d" * 40)
    repo.upload(delta_path("worker-1", 2), b"e" * 30)
    (tmp_path / "run" / "nodes" / "worker-1" / "delta_3.safetensors").symlink_to("/etc/hosts")
    doc = json.loads(invoke("storage", "status", str(tmp_path / "run"), "--format", "json").stdout)
    assert (doc["outer_step"], doc["global_bytes"], doc["keyframe_bytes"]) == (2, 80, 300)
    [node] = doc["nodes"]
    assert (node["node_id"], node["pending_deltas"], node["delta_bytes"]) == ("worker-1", 2, 30)
    assert node["newest_pending_at"] is not None  # the directory gives each delta's time
    assert doc["problems"] == ["1 file(s) under nodes/ are not deltas: ignored"]  # the link
    text = invoke("storage", "status", f"file://{tmp_path / 'run'}")
    assert text.exit_code == 0, text.stderr
    assert "each node downloads 80 B (an update; its keyframe 300 B once)" in text.stdout
    assert "worker-1: delta 30 B, 2 pending (70 B)" in text.stdout
    assert doc["ended"] is False and "ended" not in text.stdout
    repo.publish(b"u" * 80, {"outer_step": 3, "ended": True}, [])  # the master's final round
    doc = json.loads(invoke("storage", "status", str(tmp_path / "run"), "--format", "json").stdout)
    assert doc["ended"] is True, doc
    text = invoke("storage", "status", str(tmp_path / "run")).stdout
    assert "outer step 3 (the run has ended: its final global)" in text, text


def test_a_path_that_is_no_directory_and_hub_status_of_a_path_are_one_line(tmp_path):
    assert_one_line_error(invoke("storage", "status", str(tmp_path / "no")), "no such directory")
    (tmp_path / "file").write_text("x")
    assert_one_line_error(invoke("storage", "status", str(tmp_path / "file")), "not a directory")
    result = invoke("hub", "status", str(tmp_path))
    assert result.exit_code == 2 and f"speedtronic storage status {tmp_path}" in result.stderr

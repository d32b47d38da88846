"""int4 and int2 deltas end to end (issue 38): a master and two workers as ``speedtronic train``
processes over a directory, the workers sending low-bit deltas with error feedback. Every
node's last delta is counted (I6), every delta a worker sent is at most 0.30 (int4) / 0.20
(int2) of a bf16 delta's bytes, and the fleet learns through the published global: full
weights, or (int2's run) int8 updates on keyframes, which every node ends on the same."""

from __future__ import annotations

import json
from pathlib import Path

import proc_support
import pytest
import safetensors.torch
import torch

from speedtronic.distributed.codec import expected_delta_bytes
from speedtronic.distributed.global_update import GlobalReader
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, KEYFRAMES_DIR
from speedtronic.distributed.transport import LocalTransport
from tests.diloco import test_e2e
from tests.diloco.test_e2e import (
    _reference,
    assert_run_ended_whole,
    global_loss,
    log_of,
    start,
    wait_until,
)


def uploads(tmp_path: Path, node: str) -> list[dict]:
    path = tmp_path / node / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r["event"] == "diloco_upload"]


def published(repo: Path):
    read = GlobalReader(LocalTransport(repo), _reference()).read(1 << 24)
    return read.outer_step, read.weights


@pytest.mark.slow
@pytest.mark.parametrize(
    ("encoding", "share", "global_dtype"), [("int4", 0.30, "fp32"), ("int2", 0.20, "int8")]
)
def test_a_fleet_sending_low_bit_deltas_counts_every_last_delta_and_learns(
    tmp_path, monkeypatch, encoding, share, global_dtype
):
    logging = {**test_e2e.CONFIG["logging"], "json_file": "metrics.jsonl"}
    monkeypatch.setitem(test_e2e.CONFIG, "logging", logging)  # the uploads' sizes
    repo = tmp_path / "repo"
    master = start(
        tmp_path,
        repo,
        "master",
        "master",
        steps=1,
        train_locally=False,
        global_dtype=global_dtype,
        keyframe_every=2,
    )
    assert wait_until(lambda: (repo / GLOBAL_WEIGHTS).exists(), watch=master), log_of(
        tmp_path, "master"
    )
    initial = published(repo)[1]
    names = ["worker-1", "worker-2"]
    workers = [start(tmp_path, repo, "worker", n, steps=60, delta_dtype=encoding) for n in names]
    for name, process in zip(names, workers, strict=True):
        assert proc_support.wait(process) == 0, log_of(tmp_path, name)
    assert proc_support.wait(master) == 0, log_of(tmp_path, "master")
    assert_run_ended_whole(tmp_path, repo, names, ["master"])
    bf16 = expected_delta_bytes(_reference(), "bf16")
    for name in names:
        sizes = [r["size_bytes"] for r in uploads(tmp_path, name)]
        assert sizes and max(sizes) <= share * bf16, (name, sizes, bf16)
    step, final = published(repo)
    folder = repo / KEYFRAMES_DIR  # one keyframe at the end: each replaced one was deleted
    keyframes = sorted(p.name for p in folder.glob("*")) if global_dtype != "fp32" else []
    assert len(keyframes) == (global_dtype != "fp32"), keyframes
    assert step >= 2, log_of(tmp_path, "master")
    assert global_loss(final) < global_loss(initial) - 0.2  # learnt, through the global
    # the master's final global is the run's, as every node reads it (a keyframe at the end)
    kept = safetensors.torch.load_file(tmp_path / "master" / "final_global" / "model.safetensors")
    assert all(torch.equal(kept[k], final[k]) for k in final)

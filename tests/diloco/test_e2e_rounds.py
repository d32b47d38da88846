"""The round without a publish end to end (issue 54): a master and two workers as ``speedtronic
train`` processes over a directory, int2 deltas and ``global_dtype: deltas``, the second worker
joining after the fourth outer step. Every node's final global is the master's weights at that
outer step bit for bit (the run's final one, for the nodes whose last delta is in it: a worker
that ends first keeps the global holding its own last delta, I6), every last delta is counted,
and nothing under ``global/`` but keyframes is ever above 5% of the model's float32 bytes: the
master publishes round records, not weights."""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path

import proc_support
import pytest
import safetensors.torch
import torch

from speedtronic.distributed.codec import expected_delta_bytes
from speedtronic.distributed.global_update import GlobalReader
from speedtronic.distributed.protocol import KEYFRAMES_DIR, STEP_COUNT
from speedtronic.distributed.transport import LocalTransport
from tests.diloco.test_e2e import _reference, assert_run_ended_whole, log_of, start, wait_until


class GlobalWatch(threading.Thread):
    """A node of its own that reads every record: the weights at each outer step it replayed
    (verified against the record's sha256), and the largest file under ``global/`` outside
    ``keyframes/``, looked at every few milliseconds."""

    def __init__(self, repo: Path):
        super().__init__(daemon=True)
        self.folder, self.largest, self.done = repo / "global", 0, threading.Event()
        self.reader = GlobalReader(LocalTransport(repo), _reference())
        self.seen: dict[int, dict[str, torch.Tensor]] = {}
        replayer, apply = self.reader.replayer, self.reader.replayer._apply

        def applied(one):  # every step replayed, not only the ones a poll found
            got = apply(one)
            self.seen[replayer.step] = replayer.weights
            return got

        replayer._apply = applied

    def run(self) -> None:
        while not self.done.wait(0.005):
            for path in self.folder.rglob("*") if self.folder.is_dir() else []:
                if KEYFRAMES_DIR not in path.as_posix():
                    with contextlib.suppress(OSError):  # renamed over meanwhile
                        self.largest = max(self.largest, path.stat().st_size)
            with contextlib.suppress(Exception):  # a publish in flight: the next look
                read = self.reader.read(1 << 26)
                if read is not None:
                    self.seen[read.outer_step] = read.weights


def outer_step(repo: Path) -> int:
    try:
        return json.loads((repo / STEP_COUNT).read_text())["outer_step"]
    except (OSError, ValueError):
        return -1


def final_global(tmp_path: Path, node: str) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(tmp_path / node / "final_global" / "model.safetensors")


@pytest.mark.slow
def test_a_fleet_on_round_records_ends_on_the_masters_weights_bit_for_bit(tmp_path):
    repo = tmp_path / "repo"
    watch = GlobalWatch(repo)
    watch.start()
    more = dict(global_dtype="deltas", keyframe_every=3, delta_dtype="int2")
    master = start(tmp_path, repo, "master", "master", steps=1, train_locally=False, **more)
    first = start(tmp_path, repo, "worker", "worker-1", steps=200, **more)
    assert wait_until(lambda: outer_step(repo) >= 4, watch=first), log_of(tmp_path, "master")
    late = start(tmp_path, repo, "worker", "worker-2", steps=50, **more)  # joins at step >= 4
    names = ["worker-1", "worker-2"]
    for name, process in zip(names, [first, late], strict=True):
        assert proc_support.wait(process) == 0, log_of(tmp_path, name)
    assert proc_support.wait(master) == 0, log_of(tmp_path, "master")
    watch.done.set()
    watch.join()
    counted = assert_run_ended_whole(tmp_path, repo, names, ["master"])
    assert counted["outer_step"] >= 5, counted
    assert not list(repo.glob("nodes/*/delta_*.safetensors")), log_of(tmp_path, "master")
    fp32 = expected_delta_bytes(_reference(), "fp32")
    assert 0 < watch.largest <= 0.05 * fp32, (watch.largest, fp32)
    kept = final_global(tmp_path, "master")
    ends = {name: json.loads((tmp_path / name / "final_global" / "meta.json").read_text())["step"]
            for name in ["master", *names]}  # fmt: skip
    assert ends["master"] == counted["outer_step"] and max(ends.values()) == ends["master"]
    for name, step in ends.items():  # the master's weights at the node's last step, exactly
        assert step in watch.seen, (name, step, sorted(watch.seen))
        theirs = final_global(tmp_path, name)
        assert all(torch.equal(theirs[k], v) for k, v in watch.seen[step].items()), name
        if step == ends["master"]:  # the run's final global: the whole checkpoint is the same
            assert theirs.keys() == kept.keys()
            assert all(torch.equal(theirs[k], kept[k]) for k in kept), name

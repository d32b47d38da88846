"""I3 under SIGKILL: a master killed in the middle of a publish, then restarted.

The child process runs a real ``MasterLoop`` over a directory whose publish pauses between
writing the weights and writing ``step_count.json`` (and says so with a marker file); the test
kills it there with SIGKILL. A restarted master must not go back a step, and every outer step
the repo shows must mean the weights the master saved for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import proc_support
import torch
from diloco_support import Log, settings

from speedtronic.distributed.codec import decode_weights, encode_delta
from speedtronic.distributed.master.loop import MasterLoop
from speedtronic.distributed.master.outer import MasterState
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, DeltaHeader
from speedtronic.distributed.transport import LocalTransport

CHILD = """
import sys, time, torch
from pathlib import Path
sys.path.insert(0, {tests!r})
from diloco_support import Log, settings
from speedtronic.distributed.master.loop import MasterLoop
from speedtronic.distributed.transport import LocalTransport

class PausingTransport(LocalTransport):
    def publish(self, weights, step_count, consumed):
        if step_count["outer_step"] == 1:  # the first round's publish: stop half-way
            self._write("global/latest.safetensors", weights)
            Path({marker!r}).write_text("weights written")
            time.sleep(60)
        super().publish(weights, step_count, consumed)

loop = MasterLoop(settings(), {{"weight": torch.ones(1, 2)}}, PausingTransport({repo!r}),
                  Log(), {state!r})
loop.start()
while True:
    loop.poll_once()
    time.sleep(0.05)
"""


def test_I3_master_killed_mid_publish_restarts_without_going_back(tmp_path):
    repo, state, marker = tmp_path / "repo", tmp_path / "state", tmp_path / "marker"
    tests = str(Path(__file__).resolve().parents[1])
    code = CHILD.format(tests=tests, marker=str(marker), repo=str(repo), state=str(state))
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ})
    try:
        transport = LocalTransport(repo)
        # waited for by the child's progress, not a clock: it imports torch first
        proc_support.wait_for(lambda: transport.read_step_count() is not None, child)
        header = DeltaHeader("node-a", 1, 0, 2, 20, "fp32", "t")
        delta = encode_delta({"weight": torch.full((1, 2), 0.5)}, header)
        transport.upload("nodes/node-a/delta_00000001.safetensors", delta)
        proc_support.wait_for(marker.exists, child)
        assert marker.exists() and child.poll() is None
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        child.kill()
    # Killed between the two writes: the weights say step 1, step_count still says 0.
    assert transport.read_step_count()["outer_step"] == 0
    saved = MasterState.load(state)
    assert saved.outer_step == 1  # saved before the publish began
    restarted = MasterLoop(settings(), {"weight": torch.ones(1, 2)}, transport, Log(), state)
    restarted.start()
    assert restarted.master.outer_step == 1
    assert transport.read_step_count()["outer_step"] == 1  # republished, same step
    step, weights = decode_weights(
        (repo / GLOBAL_WEIGHTS).read_bytes(), {"weight": torch.ones(1, 2)}
    )
    assert step == 1 and torch.equal(weights["weight"], saved.global_weights["weight"])
    assert torch.equal(weights["weight"], torch.full((1, 2), 0.5))  # lr 1, momentum 0
    restarted.poll_once()  # the consumed delta is not counted a second time
    assert restarted.master.outer_step == 1

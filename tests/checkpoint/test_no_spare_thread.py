"""A save and a load never depend on a spare thread (issue 36).

The suite once failed in ``test_ckpt_inspect_json`` with ``RuntimeError: can't start new
thread`` from the checkpoint writer's pool on a loaded machine. With no helper thread to be
had, the hashing and fsyncs run on the calling thread: same files, same hashes.
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from speedtronic.checkpoint import load_checkpoint, save_checkpoint
from speedtronic.checkpoint.helpers import Helpers
from speedtronic.checkpoint.layout import verify_checkpoint


@pytest.fixture
def no_threads(monkeypatch):
    """Every thread start fails, as at a process's thread limit."""

    def refuse(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)


def test_a_checkpoint_is_saved_and_loaded_with_no_thread_to_spare(tmp_path, no_threads):
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    state = {"optimizer": {"step": torch.arange(5)}, "data": 3}
    meta = {"run_id": "run-a", "tokens": 30, "samples": 3, "loss": 1.5, "config": {}}
    path = save_checkpoint(tmp_path, 3, model.state_dict(), state, meta)
    assert verify_checkpoint(path) == ("ok", None)  # the recorded hashes are the files'
    loaded = load_checkpoint(path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.model_state[name], tensor), name
    assert torch.equal(loaded.trainer_state["optimizer"]["step"], torch.arange(5))


def test_work_that_gets_no_thread_runs_once_on_the_thread_that_asks(no_threads):
    calls = []
    with Helpers(2) as helpers:
        future = helpers.submit(lambda x: calls.append(x) or x * 2, 21)
        assert calls == [] and helpers.inline == 1
        assert future.result() == 42 and future.result() == 42
    assert calls == [21]


def test_helpers_run_at_most_their_limit_at_once():
    running, peak, lock = [0], [0], threading.Lock()
    release = threading.Event()

    def work():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        release.wait(5)
        with lock:
            running[0] -= 1

    with Helpers(2) as helpers:
        futures = [helpers.submit(work) for _ in range(2)]
        release.set()  # the third waits for a slot, then runs
        futures.append(helpers.submit(work))
    assert all(f.done() for f in futures) and peak[0] <= 2

"""What a node says and keeps when it stops or ends short of a global (issue 36).

A stop is not an end: the grace of a signalled node (``stopping.EndClock``); a worker whose
deltas never went out says so, with the --resume that sends them, even with no global at all;
a worker never creates the shared directory, the master does.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from diloco_support import Log, settings

from diloco.test_nodes import FakeTrainer, FlakyTransport, model
from speedtronic.distributed.stopping import EndClock, Signals
from speedtronic.distributed.transport import LocalTransport
from speedtronic.distributed.worker.plugin import WorkerPlugin
from speedtronic.errors import ConfigError, TransportError


def test_a_signal_cuts_the_end_to_its_grace_and_a_second_to_nothing():
    signals = Signals()
    clock = EndClock(signals, grace_s=5.0)  # a normal end: no limit of its own
    assert clock.left() == float("inf") and not clock.stopping
    signals.record(15)
    assert clock.stopping and 0 < clock.left() <= 5.0
    signals.record(15)
    assert clock.left() == 0.0 and signals.stop_signal == 15


def test_a_worker_with_no_global_and_unsent_deltas_says_so_and_how_to_send_them(tmp_path):
    """Before: 'no global weights in ... at the end; nothing written', and nothing about the
    deltas that waited in the checkpoint."""
    transport, log = FlakyTransport(tmp_path, down=True), Log()
    net = model(1.0)
    plugin = WorkerPlugin(settings(upload_timeout_s=0.2), net, transport, log)
    trainer, result = FakeTrainer(net, max_steps=4), SimpleNamespace(unsent=False)
    plugin.on_train_start(trainer)
    for _ in range(4):
        trainer.train_step(plugin)
    plugin.on_train_end(trainer, result)
    [line] = [w for w in log.warnings if "at the end" in w]
    assert "no global weights" in line and "deltas are unsent" in line, line
    assert "--resume sends them" in line and result.unsent


@pytest.mark.parametrize("stop_signal", [None, 15])
def test_a_stopped_worker_logs_no_diloco_final_the_event_of_a_run_that_ended(tmp_path, stop_signal):
    """Issue 48: a worker stopped by SIGTERM wrote diloco_final; a stop is not an end."""
    transport, log = LocalTransport(tmp_path), Log()
    net = model(1.0)
    plugin = WorkerPlugin(settings(stop_grace_s=0.2), net, transport, log, background=False)
    trainer = FakeTrainer(net, max_steps=4)
    plugin.on_train_start(trainer)
    for _ in range(3):
        trainer.train_step(plugin)
    trainer.stop_signal = stop_signal
    plugin.on_train_end(trainer, SimpleNamespace(unsent=False))
    finals = [event for event, _ in log.events if event == "diloco_final"]
    assert len(finals) == (stop_signal is None), log.events


def test_a_worker_never_creates_the_shared_directory(tmp_path):
    missing = tmp_path / "shared" / "run"
    with pytest.raises(ConfigError, match="does not exist .*a worker never creates it"):
        LocalTransport(missing).prepare(settings(role="worker", repo_id=str(missing)), Log())
    assert not (tmp_path / "shared").exists()
    LocalTransport(missing).prepare(settings(role="master", repo_id=str(missing)), Log())
    assert missing.is_dir()  # the master does


def test_a_workers_write_into_a_vanished_directory_recreates_nothing(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    transport = LocalTransport(root)
    transport.prepare(settings(role="worker", repo_id=str(root)), Log())
    root.rmdir()  # unmounted, or deleted
    with pytest.raises(TransportError, match="is gone") as caught:
        transport.upload("nodes/w/delta_1.safetensors", b"x")
    assert caught.value.permanent and not root.exists()


def test_the_card_of_a_final_global_counts_the_fleets_optimizer_steps_not_its_outer_steps():
    """Before: 'optimizer steps 3' (the outer step) for 2 x 30 trained steps."""
    from speedtronic.data.tokenizer import ByteTokenizer
    from speedtronic.model import ReferenceConfig
    from speedtronic.modelout.card import CardFacts, model_card

    meta = {"step": 3, "optimizer_steps": 60, "tokens": 15360, "diloco": {"outer_step": 3}}
    config = ReferenceConfig(vocab_size=256, seq_len=32, n_layer=1, n_head=2, d_model=64)
    facts = CardFacts(
        "m", "runs/b/final_global", config, 1000, "fp32", meta, {}, ByteTokenizer(), None
    )
    card = model_card(facts)
    assert "| optimizer steps | 60 (the fleet's, added up) |" in card, card
    assert "| tokens trained | 15,360 |" in card and "| DumbDiLoCo outer steps | 3 |" in card


def test_a_resumed_node_does_not_resend_a_delta_in_flight_at_its_checkpoint_once_applied(
    tmp_path,
):
    """Before: a --resume'd finished master uploaded its own last delta again (caught in flight
    by the checkpoint of its last step), and it stayed in the repo of a run that had ended."""
    import json
    import threading

    from diloco.test_nodes import wait_for
    from speedtronic.distributed.protocol import STEP_COUNT

    class Hanging(LocalTransport):
        release = threading.Event()

        def upload(self, path, data):
            self.release.wait()
            super().upload(path, data)

    transport = Hanging(tmp_path / "repo")
    net = model(1.0)
    worker, trainer = WorkerPlugin(settings(), net, transport, Log()), FakeTrainer(net)
    worker.on_train_start(trainer)
    trainer.train_step(worker, move=-0.1)
    trainer.train_step(worker, move=-0.1)
    assert wait_for(lambda: worker.uploader.sending is not None)
    state = worker.state_dict()  # the checkpoint: the delta is on its way
    transport.release.set()
    assert wait_for(lambda: worker.counters["uploads"] == 1)
    worker.status.stop.set()
    [ref] = transport.list_deltas()
    (tmp_path / "repo" / ref.path).unlink()  # the master applied it, and said so
    counted = {"outer_step": 1, "nodes": {"node-a": {"seq": 1, "chain": state["chain"]}}}
    (tmp_path / "repo" / STEP_COUNT).parent.mkdir()
    (tmp_path / "repo" / STEP_COUNT).write_text(json.dumps(counted))
    resumed = WorkerPlugin(settings(), model(), transport, Log(), background=False)
    resumed.load_state_dict(state)
    resumed.uploader.number_past_used()
    assert resumed.uploader.send_pending() and transport.list_deltas() == []


def test_a_completed_run_with_unsent_deltas_prints_the_resume_command_that_sends_them(
    monkeypatch,
):
    from typer.testing import CliRunner

    import speedtronic.runtime
    from speedtronic.cli.app import app
    from speedtronic.train.trainer import TrainResult

    done = TrainResult(steps=4, final_loss=1.0, tokens=64, samples=4, elapsed_s=1.0, unsent=True)
    monkeypatch.setattr(speedtronic.runtime, "train_from_config", lambda *a, **k: done)
    monkeypatch.setattr("sys.argv", ["speedtronic", "train", "--max-steps", "4"])
    result = CliRunner().invoke(app, ["train", "--max-steps", "4"])
    assert result.exit_code == 0, result.output
    assert "send them with: speedtronic train --max-steps 4 --resume" in result.output

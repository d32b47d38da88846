"""The end of a DumbDiLoCo run and the commit point of a round (issues 26 and 27), unit by unit.

A round exists only once saved and published: a save that fails (a full disk) leaves no trace,
and no round runs while a saved step is on its way, so staleness never counts steps nodes could
not see (issue 27, defect 1). A resumed node never sends an inner loop twice (defect 6, I1). A
node whose training is done still sends what its checkpoint holds (I6); a master's roster says
whom it waits for at the end and what the final global holds.
"""

from __future__ import annotations

import errno
import json
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from diloco_support import Log, settings

from diloco.test_faults import SlowPublish, published_step, upload_delta
from diloco.test_nodes import FakeTrainer, master_loop, model
from speedtronic.distributed.master import state as master_state
from speedtronic.distributed.master.plugin import drain, serve
from speedtronic.distributed.master.roster import DEADLINE_FLOOR_S, Roster
from speedtronic.distributed.protocol import STEP_COUNT
from speedtronic.distributed.transport import LocalTransport
from speedtronic.distributed.worker.plugin import WorkerPlugin
from speedtronic.errors import TransportError

# ---------------------------------------------------------------------------- issue 27, defect 1


def test_I3_a_round_whose_save_fails_never_happened_and_the_error_names_the_file(
    tmp_path, monkeypatch
):
    """The state dir full for a while: before, rounds ran in memory, the step moved on, and
    96% of the later deltas were dropped as too stale; 'poll failed ([Errno 28] No space left
    on device)' named no path."""
    transport, log = LocalTransport(tmp_path / "repo"), Log()
    loop = master_loop(tmp_path, transport, log, max_staleness=1)
    loop.start()
    full = threading.Event()
    real = master_state.replace_atomically

    def replace(path, data):
        if full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(master_state, "replace_atomically", replace)
    full.set()
    for seq in (1, 2, 3):  # three polls while the disk is full, a delta of base 0 each
        upload_delta(transport, seq, base=0, move=0.01)
        assert loop.poll_safely() is None
    assert loop.master.outer_step == 0 and loop.master.pending == 3  # nothing taken
    assert any(str(tmp_path / "state") in w and "No space left" in w for w in log.warnings)
    full.clear()
    result = loop.poll_once()
    assert result.outer_step == 1 and len(result.included) == 3 and not result.stale
    assert published_step(tmp_path / "repo") == 1 and loop.counters["stale"] == 0


def test_I3_rounds_wait_for_a_publish_to_land_and_staleness_counts_from_the_landed_step(
    tmp_path,
):
    """Issue 27's Hub shape: rounds 1-5 ran while only step 0 was published, then a round
    dropped 53% of the deltas as too stale. Five nodes keep sending deltas of base 0 while the
    publishes fail; none may be dropped."""
    transport = SlowPublish(tmp_path / "repo")
    transport.release.set()
    loop = master_loop(tmp_path, transport, Log(), max_staleness=1)
    loop.start()  # step 0 landed
    transport.fail = 6
    for seq in range(1, 7):
        for node in ("a", "b", "c", "d", "e"):
            upload_delta(transport, seq, base=0, move=0.001, node=f"node-{node}")
        loop.poll_safely()
    assert loop.master.outer_step == 1 and published_step(tmp_path / "repo") == 0
    while loop.unpublished:  # its publish lands at last; then the held deltas go in a round
        loop.poll_safely()
    result = loop.poll_once(force=True)
    assert published_step(tmp_path / "repo") == 2 and loop.counters["stale"] == 0, result
    assert loop.counters["included"] == 30


# ---------------------------------------------------------------------------- issue 27, defect 6


def run_worker(worker, trainer, loop, until):
    while trainer.step < until:
        trainer.train_step(worker, move=-0.01)
        worker.uploader.send_pending()
        loop.poll_once()


def resumed(config, transport, checkpoint, max_steps):
    """A new process of the node, restored from ``checkpoint`` (plug-in state, weights, step,
    tokens), not started: (plug-in, trainer, log)."""
    net, log = model(1.0), Log()
    again = WorkerPlugin(config, net, transport, log, background=False)
    again.load_state_dict(checkpoint[0])
    with torch.no_grad():
        net.weight.copy_(checkpoint[1])
    trainer = FakeTrainer(net, max_steps=max_steps)
    trainer.step, trainer.tokens = checkpoint[2], checkpoint[3]
    return again, trainer, log


def test_I1_a_resume_after_a_mid_run_checkpoint_never_counts_an_inner_loop_twice(tmp_path):
    """Before: the resumed node sent steps 5-8 again under new names and the master applied
    both copies (1,205 steps of deltas for 1,200 trained, at checkpoint.interval)."""
    transport = LocalTransport(tmp_path / "repo")
    loop = master_loop(tmp_path, transport, Log())
    loop.start()
    net, config = model(1.0), settings(inner_steps=2)
    worker, trainer = WorkerPlugin(config, net, transport, Log(), background=False), None
    trainer = FakeTrainer(net, max_steps=8)
    worker.on_train_start(trainer)
    tokens: list[int] = []
    loop.logger.log = lambda event, payload: tokens.append(payload.get("tokens", 0))
    run_worker(worker, trainer, loop, 4)
    checkpoint = (worker.state_dict(), net.weight.detach().clone(), trainer.step, trainer.tokens)
    run_worker(worker, trainer, loop, 8)  # this process sends steps 5-8, then dies
    worker.uploader.send_pending()

    again, trainer2, log2 = resumed(config, transport, checkpoint, max_steps=8)
    again.on_train_start(trainer2)
    run_worker(again, trainer2, loop, 8)
    again.on_train_end(trainer2, None)
    loop.poll_once(force=True)
    assert sum(tokens) == 8 * 10  # every step's tokens once: 8 steps of 10 tokens
    said = "after the checkpoint of step 4, this node's previous process sent its inner loops"
    said += " up to step 8"
    assert any(said in w for w in log2.warnings), log2.warnings


def test_I1_a_resumed_node_sent_only_what_its_checkpoint_held_unsent_says_so(tmp_path):
    """Issue 48: 'sent its inner loops up to step 4 after the checkpoint' of step 4."""
    transport = LocalTransport(tmp_path / "repo")
    net, log = model(1.0), Log()
    worker = WorkerPlugin(settings(), net, transport, Log(), background=False)
    trainer = FakeTrainer(net, max_steps=8)
    worker.on_train_start(trainer)
    for _ in range(4):
        trainer.train_step(worker)
    state = worker.state_dict()  # the checkpoint of step 4, its last inner loop unsent
    worker.uploader.send_pending()  # then sent by this process, which dies
    again = WorkerPlugin(settings(), model(1.0), transport, log, background=False)
    again.load_state_dict(state)
    again.on_train_start(trainer)
    said = "after the checkpoint of step 4, this node's previous process sent the inner loops "
    assert any(f"{said}the checkpoint held unsent (to step 4)" in w for w in log.warnings), (
        log.warnings
    )


class ReadFailsOnce(LocalTransport):
    """The master's first read of ``path`` times out (issue 47's chaos: an S3 read timeout)."""

    def __init__(self, root, path):
        super().__init__(root)
        self.path, self.failed = path, False

    def read(self, path, max_bytes):
        if path == self.path and not self.failed:
            self.failed = True
            raise TransportError("read timed out (chaos)")
        return super().read(path, max_bytes)


def test_I1_a_resumed_node_sees_its_loops_applied_before_an_older_delta_of_its_chain(tmp_path):
    """Chaos run, worker w1: the master could not read its seq 8 at first and applied 9 and 10
    (to step 220) a round before 8 (to step 180); step_count then named 8 as its newest applied,
    and w1 resumed from its checkpoint of step 200 (seq 9's inner loop unsent) found nothing it
    had sent past it: it trained and sent 200->220 again, and the master counted 620 of its
    600 steps."""
    transport = ReadFailsOnce(tmp_path / "repo", "nodes/node-a/delta_00000002.safetensors")
    loop = master_loop(tmp_path, transport, Log())
    loop.start()
    net, config = model(1.0), settings(inner_steps=2)
    worker = WorkerPlugin(config, net, transport, Log(), background=False)
    trainer = FakeTrainer(net, max_steps=10)
    worker.on_train_start(trainer)
    run_worker(worker, trainer, loop, 2)  # seq 1 (steps 0-2): applied
    for _ in range(4):  # seq 2 (2-4), then the loop 4-6, caught unsent by the checkpoint
        trainer.train_step(worker, move=-0.01)
        if trainer.step == 4:
            worker.uploader.send_pending()
    checkpoint = (worker.state_dict(), net.weight.detach().clone(), trainer.step, trainer.tokens)
    worker.uploader.send_pending()  # seq 3 (4-6)
    for _ in range(2):
        trainer.train_step(worker, move=-0.01)
    worker.uploader.send_pending()  # seq 4 (6-8), then this process dies
    loop.poll_once()  # seq 2 cannot be read: 3 and 4 go in
    loop.poll_once(force=True)  # then 2, the oldest, in a round of its own
    assert transport.failed and transport.list_deltas() == []
    counted = json.loads((tmp_path / "repo" / STEP_COUNT).read_text())["nodes"]["node-a"]
    assert (counted["seq"], counted["end_step"], counted["steps_total"]) == (4, 8, 8), counted

    again, trainer2, log2 = resumed(config, transport, checkpoint, max_steps=10)
    again.on_train_start(trainer2)
    run_worker(again, trainer2, loop, 10)
    again.on_train_end(trainer2, None)
    loop.poll_once(force=True)
    counted = json.loads((tmp_path / "repo" / STEP_COUNT).read_text())["nodes"]["node-a"]
    assert counted["steps_total"] == 10, counted  # every step once
    said = "after the checkpoint of step 6, this node's previous process sent its inner loops"
    assert any(f"{said} up to step 8" in w for w in log2.warnings), log2.warnings


# ---------------------------------------------------------------------------- I6 the run's end


class FlakyUploads(LocalTransport):
    down = False

    def upload(self, path, data):
        if self.down:
            raise TransportError("503 Service Unavailable")
        super().upload(path, data)


def test_I6_resume_at_max_steps_still_sends_what_the_checkpoint_holds_unsent(tmp_path):
    """Before: '--resume' said 'already at step 120 ... nothing to do' and sent nothing."""
    transport = FlakyUploads(tmp_path / "repo")
    loop = master_loop(tmp_path, transport, Log())
    loop.start()
    net = model(1.0)
    worker = WorkerPlugin(settings(upload_timeout_s=0.2), net, transport, Log())
    trainer = FakeTrainer(net, max_steps=4)
    worker.on_train_start(trainer)
    transport.down = True  # the last uploads fail: they stay in the checkpoint
    for _ in range(4):
        trainer.train_step(worker, move=-0.25)
    worker.on_train_end(trainer, SimpleNamespace(status="completed"))
    state = worker.state_dict()
    assert state["unsent"] is not None and state["unsent"]["final"]

    transport.down = False
    log = Log()
    log.notice = log.warnings.append
    again = WorkerPlugin(settings(), model(1.0), transport, log)
    again.load_state_dict(state)
    again.on_at_target(trainer, SimpleNamespace(status="at_target"))
    assert any("sending the deltas this node's checkpoint holds unsent" in m for m in log.warnings)
    assert loop.poll_once(force=True).outer_step == 1
    counted = json.loads((tmp_path / "repo" / STEP_COUNT).read_text())["nodes"]["node-a"]
    assert counted["final"] and counted["end_step"] == 4, counted


def test_I6_a_master_alone_at_its_end_waits_one_deadline_for_its_fleet(tmp_path):
    """A master started first that has heard from no other node waits for one (the issue's
    8 s head start lost all of the workers' work); it stops waiting once they have ended."""
    transport = LocalTransport(tmp_path / "repo")
    loop = master_loop(tmp_path, transport, Log(), node_id="master", drain_timeout_s=3.0)
    loop.start()
    loop.run_in_background(stop := threading.Event())
    worker_net = model(1.0)
    worker = WorkerPlugin(settings(announce=True), worker_net, transport, Log())
    trainer = FakeTrainer(worker_net, max_steps=2)
    timer = threading.Timer(0.5, worker.on_train_start, args=(trainer,))
    timer.start()  # the worker starts after the master's training ended

    def end_worker():
        timer.join()
        time.sleep(0.3)
        trainer.train_step(worker)
        trainer.train_step(worker)
        worker.on_train_end(trainer, None)

    threading.Thread(target=end_worker, daemon=True).start()
    began = time.monotonic()
    drain(loop, lambda: False, stragglers=True)
    stop.set()
    assert loop.roster.nodes["node-a"].ended  # it waited for the late node, to its end
    assert time.monotonic() - began < 10


def test_a_training_master_never_lists_itself_among_the_nodes_it_waits_for():
    """Issue 48: 'waiting for the last deltas of m, w' named the master's own node, whose last
    delta it had sent before the wait (its next poll reads it)."""
    roster, notices = Roster(lambda: 0.0), []
    roster.heard("m", 3)
    roster.heard("w", 2)
    config = SimpleNamespace(node_id="m", poll_interval=0.01)
    logger = SimpleNamespace(notice=notices.append)
    loop = SimpleNamespace(fatal=None, polled=True, roster=roster, config=config, logger=logger)
    for _ in range(2):  # one look each: w and m waited for, then m alone
        drain(loop, iter([False, True]).__next__, stragglers=False)
        roster.heard("w", 3, final=True)
    assert notices[0].startswith("diloco master: waiting for the last deltas of w (at most")
    assert notices[1] == "diloco master: waiting for a round to take its own last delta (m)"


@pytest.mark.parametrize("stopped", [False, True])
def test_a_stopped_master_logs_no_diloco_final_the_event_of_a_run_that_ended(tmp_path, stopped):
    """Issue 48: a stop is not an end; its run_end says interrupted."""
    log = Log()
    loop = master_loop(tmp_path, LocalTransport(tmp_path / "repo"), log)
    loop.start()
    stop = threading.Event()
    if stopped:
        stop.set()
    serve(loop, 0, stop)
    finals = [event for event, _ in log.events if event == "diloco_final"]
    assert len(finals) == (not stopped), log.events


def test_a_roster_sizes_its_deadline_from_the_fleets_pace_and_names_what_is_missing():
    now = [1000.0]
    roster = Roster(lambda: now[0], poll_interval=1.0)
    assert roster.deadline_s() == 600.0  # nothing known of the pace yet
    for seq in range(1, 4):  # node a: a delta every 30 s
        roster.heard("a", seq, created_at=f"2026-01-01T00:0{seq // 2}:{(seq % 2) * 30:02d}Z")
        now[0] += 30
    assert roster.deadline_s(roster.nodes["a"]) == 4 * 30 + 2  # 4 inner loops and 2 polls
    roster.heard("b", 1)  # b: nothing known of its own pace, the fleet's is taken
    assert roster.deadline_s(roster.nodes["b"]) == 122
    roster.heard("a", 4, final=True)
    assert roster.waiting_for() == ["b"]
    now[0] += 200
    assert roster.waiting_for() == [] and roster.fleet_ended()
    line = roster.final_line(5, {"a": {"seq": 4}, "b": {"seq": 1}})
    head = "final global outer step 5 holds a seq 4, b seq 1; missing: b sent no last delta"
    assert line.startswith(head), line
    assert "silent since" in line and "past the 122 s drain deadline" in line
    assert DEADLINE_FLOOR_S == 60.0


@pytest.mark.parametrize("dropped", ["too stale", None])
def test_a_final_line_names_a_last_delta_that_no_round_applied(dropped):
    roster = Roster(lambda: 0.0)
    roster.heard("a", 7, final=True, dropped=dropped)
    line = roster.final_line(3, {"a": {"seq": 6}})
    why = dropped or "not in a published round"
    assert line.endswith(f"missing: a last delta seq 7 not applied ({why})"), line


@pytest.mark.parametrize("interrupted", [False, True])
def test_a_final_line_says_why_the_master_ended_without_a_last_delta_as_it_happened(interrupted):
    """Issue 47: a master whose own resumed node's end marker was rejected after its wait said
    "the master did not wait: interrupted" though no signal came."""
    roster = Roster(lambda: 0.0)
    roster.restore({"m": {"seq": 47, "final": True}})
    roster.heard("m", 48, dropped="rejected: an end marker (0 steps) with non-zero tensors")
    roster.heard("w", 5)
    line = roster.final_line(27, {"m": {"seq": 47}, "w": {"seq": 5}}, interrupted)
    if interrupted:
        assert line.count("the master did not wait: interrupted") == 2, line
    else:
        assert "interrupted" not in line, line
        assert "(newest seq 48; silent since" in line and "seq 48 rejected: an end marker" in line
        assert "w sent no last delta (newest seq 5" in line and "wait had ended" in line


def test_I2_past_the_disk_budget_uploads_wait_in_the_outbox_and_installs_stay_exact(tmp_path):
    """No room for a 4th record (3 in memory, a disk budget of 0): later inner loops wait in
    the outbox, added up; once a global includes some, they go out, and the node's weights
    never move at an install (its own work is all there is)."""
    transport, log = LocalTransport(tmp_path / "repo"), Log()
    loop = master_loop(tmp_path, transport, Log())
    loop.start()
    net = model(1.0)
    config = settings(inner_steps=1, reapply_own_delta=True, in_flight_disk_bytes=0)
    worker = WorkerPlugin(config, net, transport, log, background=False, spill_dir=tmp_path)
    trainer = FakeTrainer(net)
    worker.on_train_start(trainer)
    for move in (-0.5, -0.25, -0.125, -0.0625, -0.03125):
        trainer.train_step(worker, move=move)
        worker.uploader.send_pending()
    assert worker.counters["uploads"] == 3 and worker.uploader.held
    assert worker.uploader.outbox.steps == 2  # the 4th and 5th loops, added up
    assert sum("wait in the outbox" in w for w in log.warnings) == 1
    assert loop.poll_once().outer_step == 1  # the master catches up: deltas 1-3
    worker.fetcher.refresh()
    before = net.weight.detach().clone()
    trainer.train_step(worker, move=0.0)  # installs global 1; the held delta goes out
    worker.uploader.send_pending()
    torch.testing.assert_close(net.weight, before, rtol=0, atol=1e-6)
    assert worker.counters["uploads"] == 4 and not worker.uploader.held  # loops 4-6 in one
    [record] = worker.uploader.in_flight.records
    assert record.seq == 4 and loop.poll_once().outer_step == 2
    assert loop.counters["included"] == 4 and loop.counters["stale"] == 0


def test_I6_the_final_global_is_a_checkpoint_every_tool_reads(tmp_path):
    """model.safetensors with the whole state (tied weights once, buffers), meta.json with the
    run's config: load_checkpoint and a strict load_state_dict take it, ckpt inspect shows it."""
    from speedtronic.checkpoint import load_checkpoint
    from speedtronic.checkpoint.inspection import inspect_path
    from speedtronic.data.tokenizer import ByteTokenizer
    from speedtronic.distributed.final_global import FinalGlobalWriter
    from speedtronic.distributed.worker.plugin import parameters_of, snapshot
    from speedtronic.modelout.source import open_run
    from speedtronic.registry import build_model

    params = {"vocab_size": 64, "seq_len": 16, "n_layer": 1, "n_head": 2, "d_model": 32}
    net = build_model("reference_transformer", params)
    weights = {k: v + 1.0 for k, v in snapshot(parameters_of(net)).items()}  # "the global"
    config = {"model": {"name": "reference_transformer", **params}}
    about = {"node_id": "w", "role": "worker"}
    writer = FinalGlobalWriter(net, tmp_path, config, about, ByteTokenizer())
    path = writer(weights, 7, {"holds_last_delta": True})
    writer(weights, 7, {"holds_last_delta": True})  # written again over the first: one dir
    assert path == tmp_path / "final_global" and sorted(p.name for p in tmp_path.iterdir()) == [
        "final_global"
    ]
    checkpoint = load_checkpoint(path)
    fresh = build_model("reference_transformer", params)
    fresh.load_state_dict(checkpoint.model_state, strict=True)
    for name, tensor in parameters_of(fresh).items():
        assert torch.equal(tensor, weights[name]), name
    assert checkpoint.meta["step"] == 7 and checkpoint.meta["config"] == config
    assert checkpoint.meta["diloco"]["holds_last_delta"] is True
    [entry] = inspect_path(path)["checkpoints"]
    assert entry["step"] == 7 and entry["status"] == "unverified"
    opened = open_run(path)  # what generate and export read: the model, and its tokenizer
    assert checkpoint.meta["tokenizer"]["kind"] == "byte" and opened.tokenizer is not None
    for name, tensor in parameters_of(opened.model).items():
        assert torch.equal(tensor, weights[name]), name


def test_I6_a_training_master_resumed_after_its_fleet_ended_applies_it_and_ends(tmp_path):
    """Before: '--resume' of the master said 'nothing to do' and left 99 deltas unapplied."""
    from speedtronic.distributed.master.plugin import MasterPlugin

    transport = LocalTransport(tmp_path / "repo")
    first = master_loop(tmp_path, transport, Log(), drain_timeout_s=600.0)
    first.start()  # step 0 published; then the master is gone and its worker runs to its end
    net = model(1.0)
    worker = WorkerPlugin(settings(announce=True), net, transport, Log(), background=False)
    trainer = FakeTrainer(net, max_steps=4)
    worker.on_train_start(trainer)
    for _ in range(4):
        trainer.train_step(worker, move=-0.25)
    worker.on_train_end(trainer, None)

    log = Log()
    plugin = MasterPlugin(master_loop(tmp_path, transport, log, drain_timeout_s=600.0))
    began = time.monotonic()
    plugin.on_at_target(FakeTrainer(model(1.0), max_steps=4), SimpleNamespace(status="at_target"))
    assert time.monotonic() - began < 30  # no waiting for new nodes (the deadline is 600 s)
    counted = json.loads((tmp_path / "repo" / STEP_COUNT).read_text())
    assert counted["outer_step"] == 1 and counted["nodes"]["node-a"]["final"], counted
    assert not list((tmp_path / "repo" / "nodes").glob("*/*"))  # deltas and node.json gone

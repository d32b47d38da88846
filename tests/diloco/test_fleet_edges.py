"""The fleet's edges a newcomer and an adversary found (issue 55, items 9 and 10), unit by unit.

With an int8 global a worker's final global is the master's exact final keyframe, or says it is
not the run's final global; a worker that starts on a run whose final round is out says so at
once and does not train, and one the master ended the run without says so at its end.
"""

from __future__ import annotations

import json
import threading

import pytest
import torch
from diloco_support import Log, settings

from diloco.test_nodes import FakeTrainer, master_loop, model, wait_for
from speedtronic.distributed.master.plugin import drain, finish
from speedtronic.distributed.protocol import STEP_COUNT, fleet_totals
from speedtronic.distributed.transport import LocalTransport
from speedtronic.distributed.worker.plugin import WorkerPlugin
from speedtronic.distributed.worker.taking_part import RunEnded

UNEVEN = torch.tensor([[-0.3, -0.0123]])  # a move int8 cannot carry exactly


class Said(Log):
    """A log that keeps its notices too."""

    def __init__(self):
        super().__init__()
        self.notices = []

    def notice(self, message):
        self.notices.append(message)


def int8_run(tmp_path, drain_timeout_s):
    """A master with an int8 global and a worker (background threads) at the end of its only
    inner loop, its last delta out; returns (loop, worker, writes, log, ending thread)."""
    transport = LocalTransport(tmp_path / "repo")
    loop = master_loop(tmp_path, transport, Log(), node_id="master", global_dtype="int8")
    loop.start()
    net, log, writes = model(1.0), Said(), []
    worker = WorkerPlugin(settings(drain_timeout_s=drain_timeout_s), net, transport, log)
    worker.end.final_writer = lambda weights, step, facts, nodes: (
        writes.append((step, weights, facts)) or (tmp_path / "final_global")
    )
    trainer = FakeTrainer(net, max_steps=2)
    worker.on_train_start(trainer)
    trainer.train_step(worker, move=UNEVEN)
    trainer.train_step(worker, move=UNEVEN)  # the last boundary: its delta marked final
    assert wait_for(lambda: worker.uploader.final_seq is not None)  # sent (the uploader thread)
    assert wait_for(lambda: loop.poll_once() is not None)  # outer step 1, an int8 update
    assert not loop.publisher.exact_at(1)
    ending = threading.Thread(target=worker.on_train_end, args=(trainer, None), daemon=True)
    ending.start()  # it finds outer step 1 at once: ended, holding its last delta, approximate
    return loop, worker, writes, log, ending


def test_I6_an_int8_worker_keeps_the_exact_final_keyframe_not_the_last_update(tmp_path):
    """Before: the worker wrote outer step 1 (the last int8 update, 2.5e-3 off in the issue)
    and called it the run's final global; the master's was the exact keyframe at step 2."""
    loop, worker, writes, log, ending = int8_run(tmp_path, drain_timeout_s=60.0)
    # the worker waits for the exact final global, or (before) has written step 1
    assert wait_for(lambda: not ending.is_alive() or any("exact" in n for n in log.notices))
    finish(loop)  # the final round: step 2, the same weights as a keyframe
    ending.join(60)
    assert not ending.is_alive()
    [(step, weights, facts)] = writes
    assert step == 2 and loop.publisher.exact_at(2)
    assert torch.equal(weights["weight"], loop.master.global_weights["weight"])
    assert facts["exact"] is True
    assert any("the run's final global at outer step 2" in n for n in log.notices), log.notices


def test_I6_an_int8_worker_whose_master_never_sends_the_keyframe_says_its_copy_is_not_final(
    tmp_path,
):
    loop, worker, writes, log, ending = int8_run(tmp_path, drain_timeout_s=0.5)
    ending.join(60)
    [(step, weights, facts)] = writes
    assert step == 1 and facts["exact"] is False
    said = " ".join(log.notices + log.warnings)
    assert "the run's final global at" not in said, said
    assert "it is not the run's final global" in said and "storage pull" in said, said


def ended_run(tmp_path, log=None):
    """A run whose only worker (node-a) has ended and whose master ran its final round."""
    transport = LocalTransport(tmp_path / "repo")
    loop = master_loop(tmp_path, transport, log or Log(), node_id="master")
    loop.start()
    net = model(1.0)
    worker = WorkerPlugin(settings(), net, transport, Log(), background=False)
    trainer = FakeTrainer(net, max_steps=2)
    worker.on_train_start(trainer)
    trainer.train_step(worker)
    trainer.train_step(worker)
    worker.on_train_end(trainer, None)
    return loop, transport


def ended_long_ago(repo):
    """The step count's deltas stamped an hour back (the old rule refused a new worker then)."""
    path = repo / STEP_COUNT
    counted = json.loads(path.read_text())
    for entry in counted["nodes"].values():
        entry["last_delta_at"] = "2000-01-01T00:00:00Z"
    path.write_text(json.dumps(counted))


def late_worker(transport, node_id="node-late"):
    net = model(1.0)
    config = settings(node_id=node_id, announce=True)
    worker = WorkerPlugin(config, net, transport, Log(), background=False)
    return worker, FakeTrainer(net, max_steps=2)


def node_state(tmp_path):
    """A checkpoint's worker state at step 0."""
    net = model(1.0)
    worker = WorkerPlugin(settings(), net, LocalTransport(tmp_path / "other"), Log(), False)
    worker.on_train_start(FakeTrainer(net, max_steps=2))
    return worker.state_dict()


@pytest.mark.parametrize("node_id", ["node-late", "node-a"], ids=["new", "of-the-run"])
def test_a_worker_started_after_the_final_round_says_so_at_once_and_trains_nothing(
    tmp_path, node_id
):
    """Before: it trained its 30 steps, warned 'no global holds this node's last delta' and
    exited 0 (and, for a while, was refused only ~7 minutes after the fleet's last delta).
    Started afresh, a node of the run is refused too: no master takes its deltas."""
    loop, transport = ended_run(tmp_path)
    finish(loop)  # its step count says the run has ended, at once
    late, trainer = late_worker(transport, node_id)
    with pytest.raises(RunEnded, match="ended at outer step 1 ") as info:
        late.on_train_start(trainer)
    assert info.value.exit_code == 2 and "nothing to join" in str(info.value)
    assert "storage pull" in (info.value.hint or "")
    assert late.counters["bytes_down"] == 0  # said before it read the global
    assert not late.uploader.unsent() and not transport.list_deltas()  # not even node.json
    resumed, trainer = late_worker(transport, node_id)  # from its checkpoint: it goes on, as
    resumed.load_state_dict(node_state(tmp_path))  # it may hold deltas unsent, or the run is
    resumed.on_train_start(trainer)  # being continued (its master started again)
    assert resumed.base is not None


def test_a_worker_joining_before_the_master_ends_the_run_is_taken_however_long_ago_nodes_ended(
    tmp_path,
):
    """Only the master's end says the run is over: while it waits (for a node that announced
    itself, within drain_timeout_s) a worker joins, though every node it names ended an hour
    ago (the old rule refused it); a master interrupted has not ended it, and a master started
    again takes the end back at once."""
    loop, transport = ended_run(tmp_path)
    ended_long_ago(tmp_path / "repo")
    late, trainer = late_worker(transport)
    late.on_train_start(trainer)
    assert late.base_outer_step == loop.master.outer_step
    finish(loop, interrupted=True)  # a stop is not an end: the master goes on at its next start
    assert "ended" not in json.loads((tmp_path / "repo" / STEP_COUNT).read_text())
    finish(loop)
    assert json.loads((tmp_path / "repo" / STEP_COUNT).read_text())["ended"] is True
    again = master_loop(tmp_path, transport, Log(), node_id="master")
    again.start()  # the run goes on (e.g. its workers resumed with a larger --max-steps)
    assert "ended" not in json.loads((tmp_path / "repo" / STEP_COUNT).read_text())
    other, trainer = late_worker(transport, "node-c")
    other.on_train_start(trainer)
    assert other.base_outer_step == loop.master.outer_step


def test_a_worker_that_announced_itself_before_the_final_round_is_waited_for_or_named(tmp_path):
    """Its node.json is in the repo: the master waits for it (drain_timeout_s) and, when no
    delta comes, names it as missing with the reason."""
    transport = LocalTransport(tmp_path / "repo")
    log = Said()
    loop = master_loop(tmp_path, transport, log, node_id="master", drain_timeout_s=0.5)
    loop.start()
    net = model(1.0)
    begun = WorkerPlugin(settings(node_id="node-b", announce=True), net, transport, Log(), False)
    begun.on_train_start(FakeTrainer(net, max_steps=20))
    begun.uploader.send_pending()  # its nodes/node-b/node.json
    net_a = model(1.0)
    worker = WorkerPlugin(settings(), net_a, transport, Log(), background=False)
    trainer = FakeTrainer(net_a, max_steps=2)
    worker.on_train_start(trainer)
    trainer.train_step(worker)
    trainer.train_step(worker)
    worker.on_train_end(trainer, None)
    loop.poll_once()
    drain(loop, lambda: False, stragglers=False)
    line = finish(loop)
    assert any("waiting for the last deltas of node-b" in n for n in log.notices), log.notices
    assert "missing: node-b sent no last delta (no delta yet" in line, line
    assert "past the 0 s drain deadline" in line or "past the 1 s drain deadline" in line, line


def test_a_worker_the_master_ended_the_run_without_says_so_at_its_end(tmp_path):
    """A worker that joined before the master's end but whose last delta no round took (named
    missing by the master): its end said 'the rest waits in the repo for the master', a master
    that had ended; it now says the run ended without it and how its deltas are applied."""
    transport = LocalTransport(tmp_path / "repo")
    loop = master_loop(tmp_path, transport, Log(), node_id="master")
    loop.start()
    net, log = model(1.0), Log()
    worker = WorkerPlugin(settings(), net, transport, log, background=False)
    trainer = FakeTrainer(net, max_steps=2)
    worker.on_train_start(trainer)  # joins: the run has not ended yet
    finish(loop)  # the master ends without it
    trainer.train_step(worker)
    trainer.train_step(worker)
    worker.on_train_end(trainer, None)
    [line] = [w for w in log.warnings if "no global holds this node's last delta" in w]
    assert "the run's final global at outer step 0" in line, line
    assert "the master ended the run without the rest" in line and "--resume" in line, line


def test_storage_pull_names_the_final_global_of_a_run_its_master_ended(tmp_path):
    """Before: 'the newest global (the run goes on)' whenever not every node of the run had
    ended, though the master had ended the run."""
    from speedtronic.config import SpeedtronicConfig
    from speedtronic.distributed.final_global import FinalGlobalWriter
    from speedtronic.distributed.master.loop import MasterLoop
    from speedtronic.distributed.pull import pull_final_global
    from speedtronic.distributed.worker.plugin import parameters_of, snapshot
    from speedtronic.registry import build_model

    repo = tmp_path / "repo"
    model_section = {"name": "reference_transformer", "vocab_size": 64, "seq_len": 8}
    model_section.update(n_layer=1, n_head=2, d_model=16)
    distributed = {"enabled": True, "repo_id": str(repo), "node_id": "node-b"}
    config = SpeedtronicConfig.from_dict({"model": model_section, "distributed": distributed})
    net = build_model(config.model.name, config.model.params)
    weights = snapshot(parameters_of(net), "cpu")
    loop = MasterLoop(settings(), weights, LocalTransport(repo), Log(), tmp_path / "state")
    loop.start()
    finish(loop)  # no node's last delta in it: not every node ended, yet the run did
    assert not fleet_totals(json.loads((repo / STEP_COUNT).read_text()).get("nodes"))["ended"]
    FinalGlobalWriter(net, tmp_path / "node-b", config.to_dict(redact=True), {})(weights, 0, {})
    assert pull_final_global(tmp_path / "node-b")["ended"] is True

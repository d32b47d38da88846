"""The worker plug-in and the master loop over the shared-directory transport (I1, I2, I3, I5).

A tiny ``nn.Linear`` stands in for the model and a fake trainer for the Trainer: the plug-ins
only read ``step``, ``tokens`` and ``optimizer`` from it. Training is simulated by moving the
weights by known amounts, so every expected number is computed by hand.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch
from diloco_support import Log, settings
from torch import nn

from speedtronic.distributed.codec import decode_delta, decode_weights
from speedtronic.distributed.master.loop import MasterLoop
from speedtronic.distributed.master.plugin import MasterPlugin
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS
from speedtronic.distributed.transport import LocalTransport
from speedtronic.distributed.worker.plugin import WorkerPlugin
from speedtronic.errors import TransportError


def model(value=1.0):
    layer = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(value)
    return layer


class FakeTrainer:
    """``max_steps``: where the run ends (its last boundary is then marked final, I6); None:
    a run that stops wherever on_train_end is called (an end marker follows its last delta)."""

    def __init__(self, net, max_steps=None):
        self.net, self.step, self.tokens = net, 0, 0
        self.optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        self.options = SimpleNamespace(max_steps=max_steps)
        self.stop_signal = None

    def train_step(self, plugin, move=-0.25, tokens=10):
        with torch.no_grad():
            self.net.weight.add_(move)
        self.optimizer.state[self.net.weight]["momentum_buffer"] = torch.ones(1, 2)
        self.step += 1
        self.tokens += tokens
        plugin.after_optimizer_step(self)


def wait_for(condition, timeout=60.0):
    # In-process threads, done in milliseconds; the bound is only there so that a bug ends
    # the test. Generous: a loaded machine may not schedule the thread for seconds.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


REFERENCE = {"weight": torch.ones(1, 2)}


def deltas_in(transport):
    """(header, tensors) of every delta in the repo, decoded against the initial weights."""
    return deltas_in_against(transport, REFERENCE)


def deltas_in_against(transport, reference):
    refs = transport.list_deltas()
    return [decode_delta(transport.read(r.path, 1 << 20), r.path, reference) for r in refs]


def weights_of(transport):
    return decode_weights(transport.read(GLOBAL_WEIGHTS, 1 << 20), {"weight": torch.zeros(1, 2)})


def test_pseudo_gradient_upload_has_sign_and_value_of_base_minus_current(tmp_path):
    transport, log = LocalTransport(tmp_path), Log()
    net = model(1.0)
    plugin, trainer = WorkerPlugin(settings(), net, transport, log), FakeTrainer(net, 2)
    plugin.on_train_start(trainer)
    trainer.train_step(plugin)
    trainer.train_step(plugin)  # boundary: weights 1.0 -> 0.5
    plugin.on_train_end(trainer, None)
    [(header, delta)] = deltas_in(transport)
    assert torch.equal(delta["weight"], torch.full((1, 2), 0.5))
    assert (header.steps, header.tokens, header.base_outer_step) == (2, 20, 0)


class FlakyTransport(LocalTransport):
    """Uploads fail while ``down`` is set; with ``hang`` they block until released."""

    def __init__(self, root, down=True, hang=False):
        super().__init__(root)
        self.down, self.hang, self.release = down, hang, threading.Event()
        self.calls = 0

    def upload(self, path, data):
        self.calls += 1
        if self.hang:
            self.release.wait()
        if self.down:
            raise TransportError("503 Service Unavailable")
        super().upload(path, data)


def test_I2_a_failed_upload_is_folded_into_the_next_delta(tmp_path):
    transport, log = FlakyTransport(tmp_path, down=True), Log()
    net = model(1.0)
    plugin, trainer = WorkerPlugin(settings(), net, transport, log), FakeTrainer(net)
    plugin.on_train_start(trainer)
    for _ in range(2):
        trainer.train_step(plugin)
    assert wait_for(lambda: transport.calls >= 1)
    transport.down = False
    for _ in range(2):
        trainer.train_step(plugin)
    plugin.on_train_end(trainer, None)
    decoded = deltas_in(transport)
    total = sum(delta["weight"] for _, delta in decoded)
    assert torch.equal(total, torch.full((1, 2), 1.0))  # 4 steps of -0.25: nothing lost
    assert sum(h.steps for h, _ in decoded) == 4 and plugin.counters["upload_failures"] >= 1


def test_I5_a_hanging_transport_never_stalls_training(tmp_path):
    transport, log = FlakyTransport(tmp_path, down=False, hang=True), Log()
    net = model(1.0)
    plugin, trainer = (
        WorkerPlugin(settings(upload_timeout_s=0.1), net, transport, log),
        FakeTrainer(net),
    )
    plugin.on_train_start(trainer)
    start = time.monotonic()
    for _ in range(20):
        trainer.train_step(plugin)
    assert time.monotonic() - start < 2.0  # ten boundaries while the upload hangs
    stalls = [p["stall_s"] for e, p in log.events if e == "diloco_boundary"]
    assert len(stalls) == 10 and max(stalls) < 0.5
    # Everything piled up in one folded delta, which goes out once the transport recovers.
    transport.hang = False
    transport.release.set()
    plugin.on_train_end(trainer, None)
    assert wait_for(lambda: plugin.uploader.outbox is None and plugin.uploader.sending is None)
    decoded = deltas_in(transport)
    assert sum(h.steps for h, _ in decoded) == 20
    assert torch.equal(sum(d["weight"] for _, d in decoded), torch.full((1, 2), 5.0))


def master_loop(tmp_path, transport, log, **overrides):
    weights = {"weight": torch.ones(1, 2)}
    return MasterLoop(settings(**overrides), weights, transport, log, tmp_path / "state")


def test_master_publishes_initial_global_and_rounds_consume_deltas(tmp_path):
    transport, log = LocalTransport(tmp_path / "repo"), Log()
    loop = master_loop(tmp_path, transport, log)
    loop.start()
    assert weights_of(transport)[0] == 0
    net = model(1.0)
    worker, trainer = WorkerPlugin(settings(), net, transport, Log()), FakeTrainer(net)
    worker.on_train_start(trainer)
    trainer.train_step(worker)
    trainer.train_step(worker)
    worker.uploader.drain(5.0)
    result = loop.poll_once()
    assert result.outer_step == 1 and transport.list_deltas() == []  # consumed deltas are gone
    step, weights = weights_of(transport)
    assert step == 1 and torch.equal(weights["weight"], torch.full((1, 2), 0.5))  # lr 1, mom 0
    worker.on_train_end(trainer, None)


def test_I2_with_boundary_installs_a_global_arriving_mid_loop_waits_for_the_boundary(tmp_path):
    transport, log = LocalTransport(tmp_path / "repo"), Log()
    loop = master_loop(tmp_path, transport, log)
    loop.start()
    net = model(1.0)
    worker, trainer = WorkerPlugin(settings(), net, transport, Log()), FakeTrainer(net, 2)
    worker.on_train_start(trainer)
    # Another node's delta makes a new global (weights 1.0 - 0.3 = 0.7) mid-loop.
    loop.master.global_weights["weight"].sub_(0.3)
    loop.master._step = 1
    loop.republish()
    assert wait_for(lambda: worker.fetcher.ready is not None)
    trainer.train_step(worker)
    assert torch.equal(net.weight, torch.full((1, 2), 0.75))  # not installed inside the loop
    trainer.train_step(worker)  # boundary: own delta captured first, then the global installed
    assert torch.equal(net.weight, torch.full((1, 2), 0.7))
    assert worker.base_outer_step == 1 and not trainer.optimizer.state  # inner state reset
    worker.on_train_end(trainer, None)
    [(header, delta)] = deltas_in(transport)
    assert torch.equal(delta["weight"], torch.full((1, 2), 0.5)) and header.base_outer_step == 0


def test_I1_the_same_delta_seen_twice_is_applied_once(tmp_path):
    transport, log = LocalTransport(tmp_path / "repo"), Log()
    loop = master_loop(tmp_path, transport, log)
    loop.start()
    net = model(1.0)
    worker, trainer = WorkerPlugin(settings(), net, transport, Log()), FakeTrainer(net, 2)
    worker.on_train_start(trainer)
    trainer.train_step(worker)
    trainer.train_step(worker)
    worker.on_train_end(trainer, None)
    [ref] = transport.list_deltas()
    data = transport.read(ref.path, 1 << 20)
    assert loop.poll_once().outer_step == 1
    transport.upload(ref.path, data)  # the same file again (a retried upload that had landed)
    assert loop.poll_once() is None and loop.master.outer_step == 1


def test_I1_a_restarted_worker_reusing_file_names_is_counted(tmp_path):
    transport = LocalTransport(tmp_path / "repo")
    loop = master_loop(tmp_path, transport, Log())
    loop.start()
    for move in (-0.25, -0.5):  # two lives of node-a, both starting at seq 1
        net = model(1.0)
        worker, trainer = WorkerPlugin(settings(), net, transport, Log()), FakeTrainer(net)
        worker.on_train_start(trainer)
        trainer.train_step(worker, move=move)
        trainer.train_step(worker, move=move)
        worker.on_train_end(trainer, None)
        loop.poll_once()
    assert loop.master.outer_step == 2
    assert torch.equal(loop.master.global_weights["weight"], torch.full((1, 2), -0.5))


def test_I3_a_master_resumed_from_an_older_copy_never_goes_back(tmp_path):
    transport = LocalTransport(tmp_path / "repo")
    loop = master_loop(tmp_path, transport, Log())
    loop.start()
    plugin = MasterPlugin(loop)
    old_copy = plugin.state_dict()
    for step in (1, 2):
        loop.master.global_weights["weight"].sub_(0.1)
        loop.master._step = step
        loop.republish()
    published = weights_of(transport)
    restarted = master_loop(tmp_path, transport, Log())
    again = MasterPlugin(restarted)
    again.load_state_dict(old_copy)  # the trainer resumed from a checkpoint of outer step 0
    restarted.start(again.restored)
    assert restarted.master.outer_step == 2
    assert weights_of(transport)[0] == 2
    assert torch.equal(weights_of(transport)[1]["weight"], published[1]["weight"])


def test_I3_a_master_that_lost_its_state_dir_continues_from_the_repo(tmp_path):
    transport = LocalTransport(tmp_path / "repo")
    loop = master_loop(tmp_path, transport, Log())
    loop.start()
    loop.master.global_weights["weight"].sub_(0.1)
    loop.master._step = 3
    loop.republish()
    elsewhere = MasterLoop(
        settings(), {"weight": torch.ones(1, 2)}, transport, Log(), tmp_path / "new"
    )
    elsewhere.start()
    assert elsewhere.master.outer_step == 3


@pytest.mark.parametrize("kind", ["garbage", "wrong_node", "nan"])
def test_I4_bad_deltas_are_rejected_counted_and_removed(tmp_path, kind):
    transport, log = LocalTransport(tmp_path / "repo"), Log()
    loop = master_loop(tmp_path, transport, log)
    loop.start()
    from speedtronic.distributed.codec import encode_delta
    from speedtronic.distributed.protocol import DeltaHeader

    header = DeltaHeader("node-b" if kind == "wrong_node" else "node-a", 1, 0, 2, 20, "fp32", "t")
    value = float("nan") if kind == "nan" else 0.5
    data = encode_delta({"weight": torch.full((1, 2), value)}, header)
    path = "nodes/node-a/delta_00000001.safetensors"
    transport.upload(path, b"junk" if kind == "garbage" else data)
    assert loop.poll_once() is None and loop.counters["rejected"] == 1
    assert any(f"rejected {path}" in w for w in log.warnings)
    assert loop.poll_once() is None and loop.counters["rejected"] == 1  # never fetched again


def test_I1_a_restarted_worker_without_state_does_not_overwrite_its_unconsumed_deltas(tmp_path):
    transport = LocalTransport(tmp_path)
    for _life in range(2):  # no master: the first life's delta is still in the repo
        net = model(1.0)
        worker = WorkerPlugin(settings(), net, transport, Log())
        trainer = FakeTrainer(net, max_steps=2)
        worker.on_train_start(trainer)
        trainer.train_step(worker)
        trainer.train_step(worker)
        worker.on_train_end(trainer, None)
    assert [r.path.rsplit("/", 1)[1] for r in transport.list_deltas()] == [
        "delta_00000001.safetensors",
        "delta_00000002.safetensors",
    ]


def test_worker_state_round_trips_through_a_checkpoint(tmp_path):
    transport = FlakyTransport(tmp_path, down=True)  # keeps the delta unsent, in the state
    net = model(1.0)
    worker, trainer = WorkerPlugin(settings(), net, transport, Log()), FakeTrainer(net)
    worker.on_train_start(trainer)
    for _ in range(3):
        trainer.train_step(worker)
    worker.on_train_end(trainer, None)
    state = worker.state_dict()
    again = WorkerPlugin(settings(), model(0.25), LocalTransport(tmp_path / "up"), Log())
    again.load_state_dict(state)
    assert torch.equal(again.base["weight"], torch.full((1, 2), 0.25))
    assert again.uploader.outbox.steps == 3 and torch.equal(
        again.uploader.outbox.delta["weight"], torch.full((1, 2), 0.75)
    )
    assert (again.boundary_step, again.base_outer_step) == (3, worker.base_outer_step)


def test_I4_a_corrupt_global_is_logged_and_never_installed(tmp_path):
    transport, log = LocalTransport(tmp_path), Log()
    net = model(1.0)
    worker, trainer = (
        WorkerPlugin(settings(), net, transport, log, background=False),
        FakeTrainer(net),
    )
    worker.on_train_start(trainer)
    transport.publish(b"not safetensors", {"outer_step": 5}, [])
    worker.fetcher.refresh()
    assert worker.fetcher.ready is None
    assert any("could not fetch the global" in w for w in log.warnings)
    trainer.train_step(worker)
    trainer.train_step(worker)
    assert torch.equal(net.weight, torch.full((1, 2), 0.5))  # training went on, nothing installed


@pytest.mark.parametrize(("reapply", "expected"), [(False, 0.7), (True, 0.7 - 0.5 * 20 / 40)])
def test_an_installed_global_carries_the_nodes_own_just_sent_delta_at_its_share(
    tmp_path, reapply, expected
):
    from speedtronic.distributed.codec import encode_weights

    transport = LocalTransport(tmp_path)
    net = model(1.0)
    config = settings(reapply_own_delta=reapply, outer_lr=1.0)
    worker, trainer = (
        WorkerPlugin(config, net, transport, Log(), background=False),
        FakeTrainer(net),
    )
    worker.on_train_start(trainer)
    trainer.train_step(worker)  # -0.25, 10 tokens
    weights = encode_weights({"weight": torch.full((1, 2), 0.7)}, 1)
    transport.publish(weights, {"outer_step": 1, "fleet_tokens_per_step": 20}, [])
    worker.fetcher.refresh()
    trainer.train_step(worker)  # boundary: own delta 0.5 over 20 tokens, the fleet does 40
    torch.testing.assert_close(net.weight, torch.full((1, 2), expected))
    assert worker.base_outer_step == 1

"""Error feedback on a worker (``worker/feedback``): what quantization dropped is sent later,
computed from the very bytes sent, kept across a checkpoint, restored when an upload fails,
and dropped (said in a line) when the node adopts a global it did not build on."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from diloco_support import Log, settings
from torch import nn

from speedtronic.distributed.master.plugin import MasterPlugin
from speedtronic.distributed.transport import LocalTransport
from speedtronic.distributed.worker.fetch import Ready
from speedtronic.distributed.worker.plugin import WorkerPlugin
from tests.diloco.test_nodes import (
    FakeTrainer,
    FlakyTransport,
    deltas_in_against,
    master_loop,
    model,
)


class Notes(Log):
    def __init__(self):
        super().__init__()
        self.notices = []

    def notice(self, message):
        self.notices.append(message)


class Trainer:
    """Random moves of a 16 x 40 layer (640 values: 5 blocks), the same for the same seed."""

    def __init__(self, net, seed=0):
        self.net, self.step, self.tokens = net, 0, 0
        self.optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        self.gen = torch.Generator().manual_seed(seed)

    def train_step(self, plugin):
        with torch.no_grad():
            self.net.weight.add_(0.01 * torch.randn(self.net.weight.shape, generator=self.gen))
        self.step += 1
        self.tokens += 10
        plugin.after_optimizer_step(self)


def net():
    layer = nn.Linear(40, 16, bias=False)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    return layer


def worker(transport, log=None, **overrides):
    model = net()
    config = settings(**{"delta_dtype": "int2", **overrides})
    plugin = WorkerPlugin(config, model, transport, log or Notes(), background=False)
    trainer = Trainer(model)
    plugin.on_train_start(trainer)
    return plugin, trainer


def boundaries(plugin, trainer, count):
    for _ in range(count * plugin.config.inner_steps):
        trainer.train_step(plugin)
        plugin.uploader.send_pending()


def sent_total(transport):
    return sum(d["weight"] for _, d in deltas_in_against(transport, {"weight": torch.ones(16, 40)}))


@pytest.mark.parametrize("encoding", ["int2", "int4", "int8", "bf16"])
def test_sent_deltas_plus_the_residual_are_exactly_the_nodes_progress(tmp_path, encoding):
    transport = LocalTransport(tmp_path)
    plugin, trainer = worker(transport, delta_dtype=encoding)
    boundaries(plugin, trainer, 5)
    progress = torch.ones(16, 40) - trainer.net.weight.detach()
    residual = plugin.uploader.feedback.residual["weight"]
    assert torch.allclose(sent_total(transport) + residual, progress, atol=1e-6)
    assert float(residual.norm()) > 0  # something was dropped, and kept


def test_without_error_feedback_int2_loses_what_it_dropped(tmp_path):
    with_ef, without = LocalTransport(tmp_path / "a"), LocalTransport(tmp_path / "b")
    for transport, enabled in ((with_ef, True), (without, False)):
        plugin, trainer = worker(transport, error_feedback=enabled)
        boundaries(plugin, trainer, 5)
        progress = torch.ones(16, 40) - trainer.net.weight.detach()
    assert plugin.uploader.feedback.residual is None
    error_ef = float((sent_total(with_ef) - progress).norm())
    error_plain = float((sent_total(without) - progress).norm())
    assert error_ef < 0.6 * error_plain


def test_I1_the_residual_is_exact_across_a_checkpoint_and_the_resumed_node_sends_the_same(
    tmp_path,
):
    straight, resumed = LocalTransport(tmp_path / "a"), LocalTransport(tmp_path / "b")
    plugin, trainer = worker(straight)
    boundaries(plugin, trainer, 3)
    first, trainer_b = worker(resumed)
    boundaries(first, trainer_b, 1)
    state = first.state_dict()
    again = WorkerPlugin(first.config, trainer_b.net, resumed, Notes(), background=False)
    again.load_state_dict(state)
    assert torch.equal(again.uploader.feedback.residual["weight"], state["residual"]["weight"])
    again.on_train_start(trainer_b)
    boundaries(again, trainer_b, 2)
    ref = {"weight": torch.ones(16, 40)}
    a, b = deltas_in_against(straight, ref), deltas_in_against(resumed, ref)
    assert [torch.equal(x[1]["weight"], y[1]["weight"]) for x, y in zip(a, b, strict=True)] == [
        True
    ] * 3
    assert torch.equal(plugin.uploader.feedback.residual["weight"],
                       again.uploader.feedback.residual["weight"])  # fmt: skip


def test_a_failed_upload_keeps_the_residual_it_would_have_replaced(tmp_path):
    transport = FlakyTransport(tmp_path, down=True)
    plugin, trainer = worker(transport)
    boundaries(plugin, trainer, 2)  # both fail: folded in the outbox, nothing sent
    assert plugin.uploader.feedback.residual is None and transport.calls >= 1
    transport.down = False
    boundaries(plugin, trainer, 1)
    progress = torch.ones(16, 40) - trainer.net.weight.detach()
    residual = plugin.uploader.feedback.residual["weight"]
    assert torch.allclose(sent_total(transport) + residual, progress, atol=1e-6)


def test_adopting_a_global_the_node_did_not_build_on_drops_the_residual_and_says_so(tmp_path):
    log = Notes()
    plugin, trainer = worker(LocalTransport(tmp_path), log)
    boundaries(plugin, trainer, 1)
    assert plugin.uploader.feedback.residual is not None
    plugin.fetcher.ready = Ready(5, {"weight": torch.zeros(16, 40)}, 0, replaces=False)
    plugin.install_ready(trainer)  # a newer global: the dropped part is still the node's work
    assert plugin.uploader.feedback.residual is not None
    plugin.fetcher.ready = Ready(2, {"weight": torch.zeros(16, 40)}, 0, replaces=True)
    plugin.install_ready(trainer)
    assert plugin.uploader.feedback.residual is None
    assert any("residual" in n and "dropped" in n and "global 2" in n for n in log.notices)


def test_I1_a_resumed_node_never_sends_again_the_residual_its_previous_process_sent(tmp_path):
    """Killed after its checkpoint and after sending the next inner loop (which carried the
    checkpoint's residual): the resumed node drops that loop (I1) and, before, added the same
    residual to its next delta, counting it twice."""
    transport = LocalTransport(tmp_path)
    plugin, trainer = worker(transport)
    boundaries(plugin, trainer, 1)
    state, weights = plugin.state_dict(), trainer.net.weight.detach().clone()
    at = (trainer.gen.get_state(), trainer.step, trainer.tokens)
    boundaries(plugin, trainer, 1)  # sent with the residual, then killed -9
    lost = plugin.uploader.feedback.residual["weight"]  # the killed process's: gone with it
    layer = net()
    with torch.no_grad():
        layer.weight.copy_(weights)
    again = WorkerPlugin(plugin.config, layer, transport, Notes(), background=False)
    again.load_state_dict(state)
    resumed = Trainer(layer)
    resumed.gen.set_state(at[0])
    resumed.step, resumed.tokens = at[1], at[2]
    again.on_train_start(resumed)
    boundaries(again, resumed, 2)  # the loop the killed process sent (dropped), then a new one
    progress = torch.ones(16, 40) - layer.weight.detach()
    residual = again.uploader.feedback.residual["weight"]
    assert torch.allclose(sent_total(transport) + residual + lost, progress, atol=1e-6)


class FlakyListing(LocalTransport):
    """Its first ``fail`` listings fail transiently, as a Hub 5xx or a bucket timeout does."""

    fail = 0

    def list_deltas(self):
        if self.fail > 0:
            self.fail -= 1
            raise TimeoutError("read timed out")
        return super().list_deltas()


@pytest.mark.parametrize("fail", [1, 3])
def test_I1_a_resumed_node_that_cannot_list_the_repo_sends_nothing_until_it_can(tmp_path, fail):
    """Issue 47's chaos run: a resumed node whose look at what its previous process sent failed
    transiently went on as if nothing was sent, and sent its replayed inner loop again (counted
    twice). Now it holds its deltas until the look succeeds, then drops the replayed loop."""
    transport = FlakyListing(tmp_path)
    plugin, trainer = worker(transport)
    boundaries(plugin, trainer, 1)
    state, weights = plugin.state_dict(), trainer.net.weight.detach().clone()
    at = (trainer.gen.get_state(), trainer.step, trainer.tokens)
    boundaries(plugin, trainer, 1)  # sent, then killed -9
    lost = plugin.uploader.feedback.residual["weight"]
    layer = net()
    with torch.no_grad():
        layer.weight.copy_(weights)
    log = Notes()
    again = WorkerPlugin(plugin.config, layer, transport, log, background=False)
    again.load_state_dict(state)
    resumed = Trainer(layer)
    resumed.gen.set_state(at[0])
    resumed.step, resumed.tokens = at[1], at[2]
    transport.fail = fail
    again.on_train_start(resumed)
    assert again.uploader.unsettled is not None
    boundaries(again, resumed, 2)  # the replayed loop (held, then dropped), then a new one
    again.uploader.send_pending()
    assert again.uploader.unsettled is None and transport.fail == 0
    progress = torch.ones(16, 40) - layer.weight.detach()
    residual = again.uploader.feedback.residual["weight"]
    assert torch.allclose(sent_total(transport) + residual + lost, progress, atol=1e-6)
    assert sum("sends nothing until" in w for w in log.warnings) == 1


class Snapshotting(LocalTransport):
    """Calls ``hook`` (once) as a delta's upload begins: a checkpoint with the delta in flight."""

    hook = None

    def upload(self, path, data):
        hook, self.hook = self.hook, None
        if hook is not None and "delta_" in path:
            hook()
        super().upload(path, data)


@pytest.mark.parametrize("caught", ["queued", "in flight"])
def test_I1_I6_a_master_resumed_in_its_end_wait_counts_its_own_last_delta(tmp_path, caught):
    """Issue 47's chaos run: a training master killed -9 in its end-of-run wait (its last delta,
    int2, applied) and resumed sent its error-feedback residual as an end marker; it was rejected
    ("an end marker (0 steps) with non-zero tensors") and the final line blamed an interruption
    that did not happen. The checkpoint caught the last delta queued or in flight."""
    transport, states = Snapshotting(tmp_path / "repo"), []
    config = settings(delta_dtype="int2", drain_timeout_s=600.0)
    loop = master_loop(tmp_path, transport, Log(), drain_timeout_s=600.0)
    loop.start()
    layer = model(1.0)
    first = WorkerPlugin(config, layer, transport, Log(), background=False)
    trainer = FakeTrainer(layer, max_steps=4)
    first.on_train_start(trainer)
    for _ in range(4):  # seq 1 at step 2 leaves a residual; seq 2 at step 4 is the last
        trainer.train_step(first, move=-0.25)
        if trainer.step == 4 and caught == "queued":
            states.append(first.state_dict())
        elif trainer.step == 4:
            transport.hook = lambda: states.append(first.state_dict())
        first.uploader.send_pending()
        loop.poll_once(force=True)
    assert first.uploader.feedback.residual is not None and len(states) == 1
    log = Notes()
    layer2 = model(1.0)
    again = WorkerPlugin(config, layer2, transport, log, background=False)
    again.load_state_dict(states[-1])  # killed -9 in the wait; resumed from the last checkpoint
    plugin = MasterPlugin(master_loop(tmp_path, transport, log, drain_timeout_s=600.0), again)
    resumed = FakeTrainer(layer2, max_steps=4)
    resumed.step, resumed.tokens = trainer.step, trainer.tokens
    plugin.on_at_target(resumed, SimpleNamespace(status="at_target"))
    assert not [w for w in log.warnings if "rejected" in w or "missing" in w], log.warnings
    assert any("holds every node's last delta" in n for n in log.notices), log.notices

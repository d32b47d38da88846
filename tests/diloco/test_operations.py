"""DumbDiLoCo behaviour that shared-repo services need: permanent failures stop a node, the
master paces its publishes, and the published step count summarises each node."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch
from diloco_support import Log, settings

from diloco.test_nodes import FakeTrainer, master_loop, model, wait_for
from speedtronic.distributed.protocol import STEP_COUNT
from speedtronic.distributed.transport import LocalTransport
from speedtronic.distributed.worker.plugin import WorkerPlugin
from speedtronic.errors import TransportError


def worker_on(transport, log=None, **overrides):
    """A started worker plug-in over a one-weight model, and its fake trainer."""
    net = model()
    worker = WorkerPlugin(settings(**overrides), net, transport, log or Log())
    trainer = FakeTrainer(net)
    worker.on_train_start(trainer)
    return worker, trainer


def upload_one(transport, move=-0.1, tokens=10, **overrides):
    """One inner loop of 2 steps (inner_steps), then the end of training: one delta."""
    worker, trainer = worker_on(transport, **overrides)
    trainer.options.max_steps = 2  # its last boundary says it is the last (I6)
    trainer.train_step(worker, move=move, tokens=tokens)
    trainer.train_step(worker, move=move, tokens=tokens)
    worker.on_train_end(trainer, None)


class NoAccess(TransportError):
    permanent = True


class ForbiddenUploads(LocalTransport):
    """Reads work; every upload is refused for good (a read-only token)."""

    def __init__(self, root):
        super().__init__(root)
        self.uploads = 0

    def upload(self, path, data):
        self.uploads += 1
        raise NoAccess("node-a: token cannot write to org/run (403)")


def test_a_permanent_upload_failure_stops_training_without_retrying(tmp_path):
    transport, net = ForbiddenUploads(tmp_path), model()
    plugin, trainer = WorkerPlugin(settings(), net, transport, Log()), FakeTrainer(net)
    plugin.on_train_start(trainer)
    trainer.train_step(plugin)
    trainer.train_step(plugin)  # boundary: the upload is refused in the background
    assert wait_for(lambda: plugin.fatal is not None)
    with pytest.raises(NoAccess, match="cannot write"):
        trainer.train_step(plugin)
    with pytest.raises(NoAccess):  # the end of training reports it too, never exit 0
        plugin.on_train_end(trainer, None)
    assert transport.uploads == 1  # no retry loop


def test_a_transient_upload_failure_is_not_fatal(tmp_path):
    class Flaky(LocalTransport):
        def upload(self, path, data):
            raise TransportError("503")

    net = model()
    plugin, trainer = WorkerPlugin(settings(), net, Flaky(tmp_path), Log()), FakeTrainer(net)
    plugin.on_train_start(trainer)
    for _ in range(4):
        trainer.train_step(plugin)
    assert plugin.fatal is None
    plugin.status.stop.set()


def test_a_permanent_failure_at_start_is_raised_at_once(tmp_path):
    class Missing(LocalTransport):
        def read_step_count(self):
            raise NoAccess("org/run not found: create it with speedtronic hub init org/run")

    net = model()
    plugin = WorkerPlugin(settings(), net, Missing(tmp_path), Log())
    with pytest.raises(NoAccess, match="hub init"):
        plugin.on_train_start(FakeTrainer(net))


def test_the_master_waits_min_publish_interval_between_publishes(tmp_path):
    transport, now = LocalTransport(tmp_path / "repo"), [0.0]
    transport.min_publish_interval_s = 60.0
    loop = master_loop(tmp_path, transport, Log())
    loop.clock = lambda: now[0]
    loop.start()  # publishes the initial global at t=0: a commit like any other

    upload_one(transport)
    assert loop.poll_once() is None
    now[0] = 60.0
    assert loop.poll_once().outer_step == 1
    upload_one(transport)
    now[0] = 119.0
    assert loop.poll_once() is None  # too soon: the delta waits, offered
    assert loop.poll_once(force=True).outer_step == 2  # the final round is never held back
    upload_one(transport)
    now[0] = 180.0
    assert loop.poll_once().outer_step == 3


def test_the_step_count_summarises_each_nodes_latest_delta(tmp_path):
    transport = LocalTransport(tmp_path / "repo")
    loop = master_loop(tmp_path, transport, Log())
    loop.start()
    upload_one(transport, move=-0.25, tokens=7)
    loop.poll_once()
    counted = json.loads((tmp_path / "repo" / STEP_COUNT).read_text())
    node = counted["nodes"]["node-a"]
    assert (node["seq"], node["base_outer_step"], node["tokens"]) == (1, 0, 14)
    restarted = master_loop(tmp_path, transport, Log())
    restarted.start()  # a restarted master keeps the summary
    assert restarted.intake.nodes["node-a"]["tokens"] == 14
    assert torch.equal(loop.master.global_weights["weight"], torch.full((1, 2), 0.5))


def test_sync_wait_installs_the_round_holding_the_nodes_own_delta(tmp_path):
    transport = LocalTransport(tmp_path / "repo")
    loop = master_loop(tmp_path, transport, Log())
    loop.start()
    stop = threading.Event()
    thread = loop.run_in_background(stop)
    net, log = model(), Log()
    wait = settings(sync_wait_s=10.0, reapply_own_delta=True)
    plugin, trainer = WorkerPlugin(wait, net, transport, log), FakeTrainer(net)
    plugin.on_train_start(trainer)
    trainer.train_step(plugin)
    trainer.train_step(plugin)  # the boundary waits for the master's round 1
    [boundary] = [p for e, p in log.events if e == "diloco_boundary"]
    assert boundary["installed"] == 1 and plugin.base_outer_step == 1
    # The global holds the delta already: installed as published, not re-applied on top
    assert torch.equal(net.weight.detach(), torch.full((1, 2), 0.5))
    assert trainer.optimizer.state == {}  # reset_inner_optimizer, as at any install
    stop.set()
    thread.join()
    plugin.on_train_end(trainer, None)


def test_sync_wait_gives_up_at_its_deadline_and_goes_on_asynchronously(tmp_path):
    transport = LocalTransport(tmp_path / "repo")
    master_loop(tmp_path, transport, Log()).start()  # publishes step 0, then never polls
    net, log = model(), Log()
    plugin, trainer = WorkerPlugin(settings(sync_wait_s=0.3), net, transport, log), FakeTrainer(net)
    plugin.on_train_start(trainer)
    start = time.monotonic()
    trainer.train_step(plugin)
    trainer.train_step(plugin)
    assert 0.3 <= time.monotonic() - start < 2.0
    [boundary] = [p for e, p in log.events if e == "diloco_boundary"]
    assert boundary["installed"] is None and plugin.counters["uploads"] == 1
    plugin.on_train_end(trainer, None)


class FailingPublish(LocalTransport):
    """Publishes fail while ``down`` is set (e.g. the Hub gave up after its retries)."""

    down = False

    def publish(self, weights, step_count, consumed):
        if self.down:
            raise TransportError("503: retries ran out")
        super().publish(weights, step_count, consumed)


def test_a_failed_publish_is_published_by_the_next_poll_with_its_deletions(tmp_path):
    transport = FailingPublish(tmp_path / "repo")
    loop = master_loop(tmp_path, transport, Log())
    loop.start()
    upload_one(transport)
    transport.down = True
    assert loop.poll_safely() is None  # the round ran; its publish failed
    assert loop.master.outer_step == 1 and len(transport.list_deltas()) == 1
    transport.down = False
    loop.poll_once()  # no new delta, no round: the pending publish goes out
    assert json.loads((tmp_path / "repo" / STEP_COUNT).read_text())["outer_step"] == 1
    assert transport.list_deltas() == []


def test_a_delta_applied_already_is_deleted_when_it_shows_up_again(tmp_path):
    transport = LocalTransport(tmp_path / "repo")
    loop = master_loop(tmp_path, transport, Log())
    loop.start()
    upload_one(transport)
    [ref] = transport.list_deltas()
    data = transport.read(ref.path, 1 << 20)
    assert loop.poll_once().outer_step == 1 and transport.list_deltas() == []
    transport.upload(ref.path, data)  # the same bytes again (a repeated upload)
    assert loop.poll_once() is None and loop.counters["included"] == 1
    upload_one(transport, move=-0.05)  # the next round deletes the duplicate with its own
    loop.poll_once()
    assert transport.list_deltas() == [] and loop.counters["included"] == 2


class LostAnswers(LocalTransport):
    """The first upload lands, but its answer is lost and the commit cannot be found."""

    def __init__(self, root):
        super().__init__(root)
        self.sent: list[tuple[str, bytes]] = []

    def upload(self, path, data):
        super().upload(path, data)
        self.sent.append((path, data))
        if len(self.sent) == 1:
            raise TransportError("500 after landing")


def maybe_landed(exc):
    exc.maybe_landed = True
    return exc


def test_a_delta_that_may_have_landed_goes_again_as_the_same_bytes(tmp_path):
    class Ambiguous(LostAnswers):
        def upload(self, path, data):
            try:
                super().upload(path, data)
            except TransportError as exc:
                raise maybe_landed(exc) from None

    transport = Ambiguous(tmp_path / "repo")
    loop = master_loop(tmp_path, transport, Log())
    loop.start()
    worker, trainer = worker_on(transport)
    trainer.train_step(worker, move=-0.1)
    trainer.train_step(worker, move=-0.1)
    assert wait_for(lambda: transport.sent)  # the first attempt landed; its answer was lost
    trainer.train_step(worker, move=-0.1)  # the second delta must not be added into the first
    trainer.train_step(worker, move=-0.1)
    worker.on_train_end(trainer, None)
    (first_path, first), (again_path, again) = transport.sent[:2]
    assert (again_path, again) == (first_path, first)  # the same name, the same bytes
    loop.poll_once(force=True)
    assert loop.counters["included"] == 2  # the first once (not twice), and the second


def test_a_delta_in_flight_at_a_checkpoint_is_resent_unchanged_after_a_resume(tmp_path):
    class Hanging(LocalTransport):
        release = threading.Event()

        def upload(self, path, data):
            self.release.wait()
            super().upload(path, data)

    transport = Hanging(tmp_path / "repo")
    worker, trainer = worker_on(transport)
    trainer.train_step(worker, move=-0.1)
    trainer.train_step(worker, move=-0.1)
    assert wait_for(lambda: worker.uploader.sending is not None)
    state = worker.state_dict()  # the checkpoint: the delta is on its way
    assert state["exact"]["seq"] == 1 and state["unsent"] is None
    transport.release.set()
    assert wait_for(lambda: worker.counters["uploads"] == 1)
    worker.status.stop.set()
    [ref] = transport.list_deltas()
    landed = transport.read(ref.path, 1 << 20)
    resumed = WorkerPlugin(settings(), model(), transport, Log())
    resumed.load_state_dict(state)  # a crash, then a resume from that checkpoint
    resumed.uploader.send_pending()
    assert transport.read(ref.path, 1 << 20) == landed  # sent again, byte for byte


def test_an_older_global_never_replaces_a_newer_one_waiting(tmp_path):
    transport = LocalTransport(tmp_path / "repo")
    loop = master_loop(tmp_path, transport, Log())
    loop.start()
    net = model()
    worker = WorkerPlugin(settings(), net, transport, Log())
    worker.on_train_start(FakeTrainer(net))
    upload_one(transport)
    loop.poll_once()
    worker.fetcher.refresh()
    assert worker.fetcher.ready.outer_step == 1
    fetcher = worker.fetcher
    fetcher.ready = fetcher.ready.__class__(5, fetcher.ready.weights, 0)  # a newer one arrived
    worker.fetcher.refresh()  # a slow poller with outer step 1
    assert worker.fetcher.ready.outer_step == 5
    worker.status.stop.set()


def test_one_unreadable_delta_does_not_stop_the_round(tmp_path):
    class OneBad(LocalTransport):
        def read(self, path, max_bytes):
            if path.endswith("delta_00000001.safetensors") and "node-b" in path:
                raise TransportError("503 on this file")
            return super().read(path, max_bytes)

    transport = OneBad(tmp_path / "repo")
    loop = master_loop(tmp_path, transport, Log())
    loop.start()
    upload_one(transport)  # node-a
    upload_one(transport, node_id="node-b")
    assert loop.poll_once().outer_step == 1  # node-b's file failed; node-a's still counted
    assert loop.counters["included"] == 1


@pytest.mark.slow  # 10 s of real waiting: the default suite stays near 4 min
def test_a_master_whose_final_round_stays_unpublished_does_not_end_quietly(tmp_path):
    from speedtronic.distributed.master.plugin import MasterPlugin

    transport = FailingPublish(tmp_path / "repo")
    plugin = MasterPlugin(master_loop(tmp_path, transport, Log()))
    plugin.on_train_start(None)  # publishes the initial global
    transport.down = True  # from now on every publish fails
    upload_one(transport)
    with pytest.raises(TransportError, match="saved in .* but could not be published"):
        plugin.on_train_end(None, None)

"""Eager installs (issue 19, I2): a newer global is installed as soon as it is downloaded,
between any two optimizer steps, carrying the progress made since the last boundary."""

from __future__ import annotations

from dataclasses import replace

import torch
from diloco_support import Log, settings

from diloco.test_nodes import FakeTrainer, model
from speedtronic.distributed.codec import decode_delta, encode_weights
from speedtronic.distributed.transport import LocalTransport
from speedtronic.distributed.worker.plugin import WorkerPlugin

REFERENCE = {"weight": torch.ones(1, 2)}


def eager_worker(transport, log=None, **overrides):
    net = model(1.0)
    config = settings(
        **{"inner_steps": 4, "install": "eager", "reapply_own_delta": False, **overrides}
    )
    worker = WorkerPlugin(config, net, transport, log or Log(), background=False)
    trainer = FakeTrainer(net)
    worker.on_train_start(trainer)
    return worker, trainer, net


def publish_global(transport, value: float, outer_step: int, own_seq: int) -> None:
    nodes = {"node-a": {"seq": own_seq, "base_outer_step": 0, "tokens": 40, "last_delta_at": "t"}}
    weights = encode_weights({"weight": torch.full((1, 2), value)}, outer_step)
    transport.publish(weights, {"outer_step": outer_step, "nodes": nodes}, [])


def steps(worker, trainer, n):
    for _ in range(n):
        trainer.train_step(worker, move=-0.25)
        worker.uploader.send_pending()


def test_I2_an_eager_install_mid_loop_is_the_global_plus_the_progress_since_the_boundary(
    tmp_path,
):
    transport, log = LocalTransport(tmp_path), Log()
    worker, trainer, net = eager_worker(transport, log)
    steps(worker, trainer, 6)  # a boundary at step 4 (base 0.0), then -0.5 of progress
    publish_global(transport, 2.0, outer_step=1, own_seq=1)  # a crafted global, mid-loop
    worker.fetcher.refresh()
    steps(worker, trainer, 1)  # step 7: -0.75 since the boundary; installed after it
    assert worker.base_outer_step == 1
    torch.testing.assert_close(net.weight, torch.full((1, 2), 2.0 - 0.75))  # G + progress
    [install] = [p for e, p in log.events if e == "diloco_install"]
    assert install["step"] == 7 and install["outer_step"] == 1
    steps(worker, trainer, 1)  # step 8: the boundary's delta holds all four steps' work
    header, delta = decode_delta(
        transport.read("nodes/node-a/delta_00000002.safetensors", 1 << 20),
        "nodes/node-a/delta_00000002.safetensors",
        REFERENCE,
    )
    assert header.base_outer_step == 1 and header.steps == 4
    torch.testing.assert_close(delta["weight"], torch.full((1, 2), 1.0))  # 4 x 0.25: no loss


def test_boundary_installs_wait_for_the_end_of_the_inner_loop(tmp_path):
    transport = LocalTransport(tmp_path)
    worker, trainer, net = eager_worker(transport, install="boundary")
    steps(worker, trainer, 6)
    publish_global(transport, 2.0, outer_step=1, own_seq=1)
    worker.fetcher.refresh()
    steps(worker, trainer, 1)
    assert worker.base_outer_step == -1  # nothing installed before the boundary at step 8
    steps(worker, trainer, 1)
    assert worker.base_outer_step == 1


def run_to(worker, trainer, transport, end):
    """Steps up to ``end``, with a global arriving before step 7 (an eager install there)."""
    while trainer.step < end:
        if trainer.step == 6:
            publish_global(transport, 2.0, outer_step=1, own_seq=1)
            worker.fetcher.refresh()
        steps(worker, trainer, 1)


def test_an_eager_install_resumes_exactly_from_a_checkpoint_after_it(tmp_path):
    straight = LocalTransport(tmp_path / "straight")
    worker, trainer, net = eager_worker(straight)
    run_to(worker, trainer, straight, 9)
    state = {"plugin": worker.state_dict(), "weights": net.weight.detach().clone()}
    state["trainer"] = (trainer.step, trainer.tokens)
    run_to(worker, trainer, straight, 16)

    resumed_repo = tmp_path / "resumed"
    resumed_transport = LocalTransport(resumed_repo)
    publish_global(resumed_transport, 2.0, outer_step=1, own_seq=1)  # the repo as it was
    again, again_trainer, again_net = eager_worker(resumed_transport)
    again.load_state_dict(state["plugin"])
    with torch.no_grad():
        again_net.weight.copy_(state["weights"])
    again_trainer.step, again_trainer.tokens = state["trainer"]
    run_to(again, again_trainer, resumed_transport, 16)
    assert torch.equal(again_net.weight, net.weight)
    for seq in (3, 4):  # the deltas after the checkpoint: the same, but for their time stamp
        path = f"nodes/node-a/delta_{seq:08d}.safetensors"
        (h1, d1), (h2, d2) = (
            decode_delta(t.read(path, 1 << 20), path, REFERENCE)
            for t in (straight, resumed_transport)
        )
        assert replace(h1, created_at="t") == replace(h2, created_at="t") and h1.chain
        assert torch.equal(d1["weight"], d2["weight"])


def test_a_poll_interval_far_longer_than_an_upload_is_named_with_a_better_one():
    from speedtronic.distributed.latency import poll_advice

    advice = poll_advice(poll_interval_s=60, upload_s=2.0, loop_s=150)
    assert "poll_interval 60 s" in advice and "about 2 s would do" in advice
    assert "f = 0.01" in advice
    assert poll_advice(poll_interval_s=3, upload_s=2.0, loop_s=150) is None


def test_validate_fleet_default_uplink_is_the_latency_modules():
    from speedtronic.cli.diloco_facts import Fleet
    from speedtronic.distributed.latency import DEFAULT_UPLINK_MBPS

    assert Fleet().uplink_mbps == DEFAULT_UPLINK_MBPS  # a copy, so --help need not load it


def test_validate_warns_of_settings_measured_to_hurt_a_fleet_and_still_accepts_them(tiny, tmp_path):
    import json

    from cli.test_cli import invoke, write

    tiny["run"]["max_steps"] = 120
    tiny["distributed"] = {"enabled": True, "repo_id": str(tmp_path / "repo"), "inner_steps": 10}
    quiet = invoke("validate", "-c", write(tmp_path, tiny), "--format", "json")
    assert quiet.exit_code == 0 and json.loads(quiet.stdout)["warnings"] == []

    tiny["distributed"].update(outer_momentum=0.9, reset_inner_optimizer=True)
    result = invoke("validate", "-c", write(tmp_path, tiny), "--format", "json")
    assert result.exit_code == 0, result.output  # said, not refused
    momentum, reset = json.loads(result.stdout)["warnings"]
    assert "distributed.outer_momentum 0.9 with sync_wait_s 0" in momentum and "+8.0%" in momentum
    assert "reset_inner_optimizer true over 12 rounds" in reset and "+9.8%" in reset
    assert "speedtronic: warning: distributed.outer_momentum" in result.stderr

    tiny["distributed"]["sync_wait_s"] = 30  # waiting for each round: momentum is DiLoCo's own
    tiny["run"]["max_steps"] = 30  # 3 rounds
    result = invoke("validate", "-c", write(tmp_path, tiny), "--format", "json")
    assert json.loads(result.stdout)["warnings"] == []


def test_every_ddp_rank_counts_inner_loops_from_rank_0s_worker_boundary(monkeypatch):
    """A DDP node resumed from a checkpoint (one a single process saved, too): rank 1 takes
    rank 0's boundary, so both look for installs on the same steps."""
    from speedtronic.train import parallel

    received = iter([7, -2])  # rank 0's boundary step, then its installed outer step
    monkeypatch.setattr(parallel.dist, "broadcast", lambda t, src: t.fill_(next(received)))
    sync = parallel.NodeSync(
        parallel.World(rank=1, size=2), model(1.0), settings(install="eager", inner_steps=8), "cpu"
    )
    trainer = FakeTrainer(model(1.0))
    trainer.step = 10  # resumed here; the inner loop began at step 7
    sync.on_train_start(trainer)
    assert sync.boundary == 7


def resumed(worker, trainer, state, transport, log):
    """A new process of ``worker``'s node, restored from ``state`` (its checkpoint), not started."""
    net = model(1.0)
    again = WorkerPlugin(worker.config, net, transport, log, background=False)
    again.load_state_dict(state["plugin"])
    with torch.no_grad():
        net.weight.copy_(state["weights"])
    fake = FakeTrainer(net)
    fake.step, fake.tokens = trainer.step, trainer.tokens
    return again, fake, net


def test_a_resumed_node_starts_on_the_newest_global_carrying_what_it_restored(tmp_path):
    """Issue 47's chaos: a node back from a kill built its next delta on its checkpoint's
    global, which the run had left more than max_staleness outer steps behind: dropped."""
    transport, log = LocalTransport(tmp_path), Log()
    worker, trainer, net = eager_worker(transport)
    steps(worker, trainer, 6)  # a boundary at 4, then -0.5 of progress
    state = {"plugin": worker.state_dict(), "weights": net.weight.detach().clone()}
    publish_global(transport, 2.0, outer_step=7, own_seq=1)  # the run moved on meanwhile
    again, trainer2, net2 = resumed(worker, trainer, state, transport, log)
    again.on_train_start(trainer2)
    assert again.base_outer_step == 7
    torch.testing.assert_close(net2.weight, torch.full((1, 2), 2.0 - 0.5))  # G + progress
    steps(again, trainer2, 2)  # the boundary at step 8: built on global 7
    path = "nodes/node-a/delta_00000002.safetensors"
    header, delta = decode_delta(transport.read(path, 1 << 20), path, REFERENCE)
    assert header.base_outer_step == 7 and header.steps == 4
    torch.testing.assert_close(delta["weight"], torch.full((1, 2), 1.0))  # all four steps


def test_a_resumed_node_that_cannot_read_the_global_holds_its_deltas_until_it_can(tmp_path):
    transport, log = LocalTransport(tmp_path), Log()
    publish_global(transport, 1.0, outer_step=1, own_seq=0)
    worker, trainer, net = eager_worker(transport)
    steps(worker, trainer, 6)  # a boundary at 4 (delta 1, on global 1), then -0.5 of progress
    state = {"plugin": worker.state_dict(), "weights": net.weight.detach().clone()}
    publish_global(transport, 2.0, outer_step=7, own_seq=1)  # the run moved on meanwhile
    again, trainer2, net2 = resumed(worker, trainer, state, transport, log)
    fetch_newer = again.fetcher.fetch_newer

    def down():
        raise OSError("503 Service Unavailable")

    again.fetcher.fetch_newer = down
    again.on_train_start(trainer2)
    assert again.base_outer_step == 1  # its checkpoint's: trains on, says why
    assert any("cannot read the newest global at resume" in w for w in log.warnings)
    steps(again, trainer2, 2)  # the boundary at 8: a delta on global 1 would be too stale
    path = "nodes/node-a/delta_00000002.safetensors"
    assert transport.read(path, 1 << 20) is None  # held: its base kept, its work adds up
    again.fetcher.fetch_newer = fetch_newer
    again.fetcher.refresh()
    steps(again, trainer2, 1)  # step 9: installs global 7, carrying all 5 steps since 4
    assert again.base_outer_step == 7
    torch.testing.assert_close(net2.weight, torch.full((1, 2), 2.0 - 1.25))
    steps(again, trainer2, 1)  # the boundary at 10: every step since 4, on global 7
    header, delta = decode_delta(transport.read(path, 1 << 20), path, REFERENCE)
    assert header.base_outer_step == 7 and header.steps == 6
    torch.testing.assert_close(delta["weight"], torch.full((1, 2), 1.5))  # 6 x 0.25: no loss

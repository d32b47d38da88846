"""A fleet whose model has frozen parameters (a fine-tune with ``model.lora``): only the
trainable ones travel, and every node must start from the same frozen base.

The deltas, the globals in each ``global_dtype`` (fp32 weights, int8 updates on keyframes,
round records) and the final global carry the trainable tensors alone; the final global in
each node's output directory is the whole model, its frozen base included. The master records
the base's sha256 in ``step_count.json``; a node on another base is refused in one line naming
both hashes, and so is a master restarted on another base.
"""

from __future__ import annotations

import threading

import fleet_support as fleet
import pytest
import safetensors
import safetensors.torch
import torch
from diloco_support import settings
from torch import nn

from diloco.test_nodes import FakeTrainer
from speedtronic.distributed.final_global import FinalGlobalWriter
from speedtronic.distributed.frozen_base import base_sha256
from speedtronic.distributed.master.loop import MasterLoop
from speedtronic.distributed.master.plugin import serve
from speedtronic.distributed.protocol import KEYFRAMES_DIR, STEP_COUNT, parse_step_count
from speedtronic.distributed.repo_status import directory_status
from speedtronic.distributed.transport import LocalTransport
from speedtronic.distributed.worker.plugin import WorkerPlugin, parameters_of, snapshot
from speedtronic.errors import BaseMismatch, DamagedRepoFile


class Net(nn.Module):
    """One trainable matrix (``weight``, as FakeTrainer moves it) on a frozen base."""

    def __init__(self, base: float = 3.0, frozen: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1, 2))
        self.base = nn.Parameter(torch.full((4,), base), requires_grad=not frozen)


def worker(repo, name, tmp_path, net=None, **overrides) -> fleet.Node:
    net, log = net or Net(), fleet.NoticeLog()
    config = settings(node_id=name, **{**fleet.FLEET, **overrides})
    plugin = WorkerPlugin(config, net, LocalTransport(repo), log, spill_dir=tmp_path / name)
    plugin.end.final_writer = FinalGlobalWriter(net, tmp_path / name, {}, {"node_id": name})
    return fleet.Node(name, [plugin], FakeTrainer(net), log)


def master(repo, tmp_path, net=None, **overrides) -> MasterLoop:
    net = net or Net()
    weights = snapshot(parameters_of(net))  # the trainable tensors, as setup's
    config = settings(node_id="master", **{**fleet.FLEET, **overrides})
    log = fleet.NoticeLog()
    loop = MasterLoop(config, weights, LocalTransport(repo), log, tmp_path / "state")
    loop.guard.base_sha256 = base_sha256(net)  # as distributed/setup's master_loop
    return loop


def counted(repo) -> dict:
    return parse_step_count((repo / STEP_COUNT).read_bytes())


@pytest.mark.parametrize("global_dtype", ["fp32", "int8", "deltas"])
def test_only_trainable_tensors_travel_and_the_final_global_keeps_the_base(tmp_path, global_dtype):
    repo, more = tmp_path / "repo", dict(global_dtype=global_dtype, keyframe_every=2)
    loop = master(repo, tmp_path, drain_timeout_s=3.0, **more)  # its wait for late joiners
    loop.start()
    result: dict = {}
    writer = FinalGlobalWriter(Net(), tmp_path / "master", {}, {})

    def coordinate() -> None:
        result["path"] = serve(loop, 10_000, threading.Event(), writer)

    thread = threading.Thread(target=coordinate, daemon=True)
    thread.start()
    nodes = [worker(repo, f"w{i}", tmp_path, **more).start(6, 0.01) for i in (1, 2)]
    for node in nodes:
        node.join()
    thread.join(60)
    assert not thread.is_alive() and result.get("path"), loop.logger.warnings
    assert counted(repo)["base_sha256"] == base_sha256(Net())
    assert directory_status(LocalTransport(repo))["base_sha256"] == base_sha256(Net())
    fleet.assert_every_last_delta_counted(fleet_view(repo), nodes)
    stored = [repo / "global" / "latest.safetensors", *(repo / KEYFRAMES_DIR).glob("*")]
    for path in stored:
        with safetensors.safe_open(path, "pt") as f:
            assert "base" not in set(f.keys()), path  # weights, updates, records: no base
    for name in ("master", "w1", "w2"):
        final = safetensors.torch.load_file(tmp_path / name / "final_global" / "model.safetensors")
        assert torch.equal(final["base"], torch.full((4,), 3.0)), name  # the model's own
        assert torch.allclose(final["weight"], loop.master.global_weights["weight"], atol=0.01)
    assert not torch.equal(loop.master.global_weights["weight"], torch.ones(1, 2))  # it trained


class fleet_view:  # noqa: N801 - what fleet_support's step_count(repo) reads through
    def __init__(self, root):
        self.root = root

    def transport(self, name):
        return LocalTransport(self.root)


@pytest.mark.parametrize(
    ("net", "says"),
    [
        (Net(base=2.0), "sha256 " + base_sha256(Net(base=2.0))),
        (Net(frozen=False), "none (every parameter trained)"),
    ],
    ids=["another-base", "no-base"],
)
def test_a_worker_on_another_base_is_refused_before_training(tmp_path, net, says):
    repo = tmp_path / "repo"
    master(repo, tmp_path).start()
    node = worker(repo, "w1", tmp_path, net=net)
    with pytest.raises(BaseMismatch) as caught:
        node.worker.on_train_start(node.trainer)
    line = str(caught.value)
    assert "\n" not in line and says in line and base_sha256(Net()) in line
    assert node.trainer.step == 0 and not (repo / "nodes" / "w1").exists()  # nothing sent


def test_a_repo_without_a_base_refuses_a_node_with_one_and_takes_one_without(tmp_path):
    repo = tmp_path / "repo"
    master(repo, tmp_path, net=Net(frozen=False)).start()  # a full-model run, as before LoRA
    assert "base_sha256" not in counted(repo)
    with pytest.raises(BaseMismatch, match="records none"):
        lora = worker(repo, "w1", tmp_path)
        lora.worker.on_train_start(lora.trainer)
    full = worker(repo, "w2", tmp_path, net=Net(frozen=False))
    full.worker.on_train_start(full.trainer)
    assert full.worker.base_outer_step == 0


def test_a_master_restarted_on_another_base_is_refused(tmp_path):
    repo = tmp_path / "repo"
    master(repo, tmp_path).start()
    with pytest.raises(BaseMismatch, match=base_sha256(Net(base=5.0))):
        master(repo, tmp_path / "again", net=Net(base=5.0)).start()


def test_the_base_hash_names_the_frozen_tensors_only():
    trained = Net()
    with torch.no_grad():
        trained.weight.add_(1.0)
    assert base_sha256(trained) == base_sha256(Net())  # training moves no base
    assert base_sha256(Net(frozen=False)) is None
    assert base_sha256(Net(base=2.0)) != base_sha256(Net())
    half = Net()
    half.base.data = half.base.data.to(torch.bfloat16)
    assert base_sha256(half) != base_sha256(Net())  # the same values in another dtype
    scalar = Net()
    scalar.scale = nn.Parameter(torch.tensor(2.0), requires_grad=False)  # 0-dim: hashed too
    assert base_sha256(scalar) not in (None, base_sha256(Net()))


@pytest.mark.parametrize("value", ["ABC", "0" * 63, 5, None])
def test_a_damaged_base_field_is_refused_by_name(value):
    data = f'{{"outer_step": 1, "base_sha256": {value!r}}}'.replace("'", '"').replace(
        "None", "null"
    )
    with pytest.raises(DamagedRepoFile, match="base_sha256"):
        parse_step_count(data.encode())


def test_validate_counts_the_bytes_of_the_trainable_tensors_only(tiny, tmp_path):
    from speedtronic.cli.diloco_facts import Fleet, diloco_facts
    from speedtronic.config import SpeedtronicConfig

    tiny["distributed"] = {"enabled": True, "repo_id": str(tmp_path / "repo"), "node_id": "a"}
    cfg = SpeedtronicConfig.from_dict(tiny)
    facts = diloco_facts(cfg, Net(), Fleet())
    assert facts["diloco_delta_bytes"]["fp32"] == 8  # weight's 2 floats; the base's 4 stay
    line = facts["diloco_trainable"]
    assert line.startswith("2 of 6 parameters travel") and "33.3% of the full model's" in line
    assert "diloco_trainable" not in diloco_facts(cfg, Net(frozen=False), Fleet())

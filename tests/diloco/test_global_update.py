"""The global as a keyframe plus a compressed update (issue 38, ``distributed.global_dtype``):
the bytes, the exactness every node relies on (I3), keyframes renewed and the old one deleted,
a restarted master that publishes the same bytes, and the hostile files a reader refuses (I4)."""

from __future__ import annotations

import hashlib
import json

import pytest
import safetensors.torch
import torch
from diloco_support import Log, settings

from speedtronic.distributed.codec import PACKED_SCALES, BadDelta, encode_weights
from speedtronic.distributed.global_update import (
    GlobalReader,
    as_keyframe,
    encode_global,
)
from speedtronic.distributed.master.loop import MasterLoop
from speedtronic.distributed.master.plugin import MasterPlugin
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, KEYFRAMES_DIR, STEP_COUNT
from speedtronic.distributed.transport import LocalTransport
from speedtronic.distributed.worker.plugin import WorkerPlugin
from speedtronic.errors import ConfigError
from tests.diloco.test_codec import resaved
from tests.diloco.test_nodes import FakeTrainer, model


@pytest.fixture
def weights() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(256, 64, generator=gen),  # 16384 values: 128 blocks
        "ln.weight": torch.ones(7),
        "head.bias": torch.randn(33, generator=gen),  # a ragged block
    }


def moved(weights, scale=0.01, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=gen) for k, v in weights.items()}


def published(transport, weights, step, keyframe, dtype="int8"):
    """What a master's publish leaves in a directory repo: the keyframe, then the update."""
    if keyframe is not None:
        transport.upload(keyframe.path, keyframe.data)
    data = encode_global(weights, step, keyframe, dtype)
    count = {"outer_step": step, "weights_sha256": hashlib.sha256(data).hexdigest(), "format": 1}
    transport.publish(data, count, [])
    return data


@pytest.mark.parametrize(("dtype", "share"), [("int8", 0.27), ("int4", 0.14)])
def test_an_update_is_a_fraction_of_the_weights_and_within_half_a_step(
    tmp_path, weights, dtype, share
):
    keyframe, now = as_keyframe(weights, 3), moved(weights)
    transport = LocalTransport(tmp_path / "repo")
    data = published(transport, now, 5, keyframe, dtype)
    assert len(data) <= share * len(encode_weights(now, 5))
    read = GlobalReader(transport, weights, hashed=True).read(1 << 22)
    assert read.outer_step == 5 and read.sha256 == hashlib.sha256(data).hexdigest()
    top = {"int8": 127, "int4": 7}[dtype]
    for key, value in now.items():
        update = value - keyframe.weights[key]
        step = update.abs().max() / top  # the largest block scale bounds every block's step
        assert bool(((read.weights[key] - value).abs() <= 0.5 * step + 1e-6).all())


def test_an_update_on_its_own_step_keyframe_is_the_weights_exactly(tmp_path, weights):
    transport = LocalTransport(tmp_path / "repo")
    published(transport, weights, 4, as_keyframe(weights, 4))
    read = GlobalReader(transport, weights).read(1 << 22)
    assert all(torch.equal(read.weights[k], weights[k]) for k in weights)


def test_a_reader_downloads_a_keyframe_once(tmp_path, weights):
    transport, keyframe = LocalTransport(tmp_path / "repo"), as_keyframe(weights, 0)
    reader = GlobalReader(transport, weights)
    first = published(transport, moved(weights, seed=1), 1, keyframe)
    assert reader.read(1 << 22).bytes_read == len(first) + len(keyframe.data)
    second = published(transport, moved(weights, seed=2), 2, keyframe)
    assert reader.read(1 << 22).bytes_read == len(second)  # the update only


def test_full_weights_still_read_as_before(tmp_path, weights):
    transport = LocalTransport(tmp_path / "repo")
    published(transport, weights, 2, None, "fp32")
    read = GlobalReader(transport, weights).read(1 << 22)
    assert read.outer_step == 2 and read.keyframe is None
    assert all(torch.equal(read.weights[k], weights[k]) for k in weights)


# ---- I4: hostile updates and keyframes -----------------------------------------------------


def refused(transport, weights, match):
    with pytest.raises(BadDelta, match=match) as info:
        GlobalReader(transport, weights).read(1 << 22)
    assert "\n" not in str(info.value)


def test_I4_a_keyframe_edited_since_the_update_named_it_is_refused(tmp_path, weights):
    transport, keyframe = LocalTransport(tmp_path / "repo"), as_keyframe(weights, 0)
    published(transport, moved(weights), 1, keyframe)
    other = encode_weights(moved(weights, seed=7), 0)
    (tmp_path / "repo" / keyframe.path).write_bytes(other)
    refused(transport, weights, "does not match the sha256 the global's update names")


def test_I4_a_missing_keyframe_is_named(tmp_path, weights):
    transport, keyframe = LocalTransport(tmp_path / "repo"), as_keyframe(weights, 0)
    published(transport, moved(weights), 1, keyframe)
    (tmp_path / "repo" / keyframe.path).unlink()
    refused(transport, weights, f"{keyframe.path} is missing")


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"keyframe_step": "9"}, "names a later keyframe"),
        ({"encoding": "int2"}, "update encoding 'int2'"),
        ({"keyframe_sha256": "../../etc"}, "not 64 lowercase hex digits"),
        ({"layout": "0123456789abcdef"}, "packed for other tensor names or shapes"),
        ({"format": "speedtronic-global-9"}, "weights format 'speedtronic-global-9'"),
    ],
)
def test_I4_an_update_header_that_does_not_hold_is_refused(tmp_path, weights, changes, match):
    transport, keyframe = LocalTransport(tmp_path / "repo"), as_keyframe(weights, 0)
    data = published(transport, moved(weights), 1, keyframe)
    (tmp_path / "repo" / GLOBAL_WEIGHTS).write_bytes(resaved(data, changes))
    refused(transport, weights, match)


def test_I4_an_update_with_a_negative_scale_is_refused(tmp_path, weights):
    transport, keyframe = LocalTransport(tmp_path / "repo"), as_keyframe(weights, 0)
    data = published(transport, moved(weights), 1, keyframe)
    scales = safetensors.torch.load(data)[PACKED_SCALES].clone()
    scales[0] = -1.0
    (tmp_path / "repo" / GLOBAL_WEIGHTS).write_bytes(resaved(data, None, {PACKED_SCALES: scales}))
    refused(transport, weights, "negative, NaN or Inf scale")


# ---- a master publishing updates -----------------------------------------------------------


def int8_loop(tmp_path, transport, log=None, state="state", dtype="int8"):
    overrides = dict(global_dtype=dtype, keyframe_every=2)
    weights = {"weight": torch.ones(1, 2)}
    return MasterLoop(settings(**overrides), weights, transport, log or Log(), tmp_path / state)


def step_to(loop, step, value):
    loop.master._weights = {"weight": torch.full((1, 2), value)}  # a round makes new tensors
    loop.master._step = step
    loop.republish()


def keyframes(tmp_path):
    folder = tmp_path / "repo" / KEYFRAMES_DIR
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_a_master_renews_its_keyframe_and_deletes_the_one_it_replaces(tmp_path):
    transport = LocalTransport(tmp_path / "repo")
    loop = int8_loop(tmp_path, transport)
    loop.start()
    assert keyframes(tmp_path) == [loop.publisher.keyframe.path.split("/")[-1]]
    first = keyframes(tmp_path)
    step_to(loop, 1, 0.7)  # an update on keyframe 0
    assert keyframes(tmp_path) == first
    step_to(loop, 2, 0.4)  # keyframe_every 2: a new keyframe, the old one deleted
    assert len(keyframes(tmp_path)) == 1 and keyframes(tmp_path) != first
    read = GlobalReader(transport, {"weight": torch.zeros(1, 2)}).read(1 << 20)
    assert read.outer_step == 2 and torch.equal(read.weights["weight"], torch.full((1, 2), 0.4))


def test_I3_a_restarted_master_holds_the_repo_to_the_same_bytes(tmp_path):
    transport, log = LocalTransport(tmp_path / "repo"), Log()
    loop = int8_loop(tmp_path, transport)
    loop.start()
    step_to(loop, 1, 0.7)
    path = tmp_path / "repo" / STEP_COUNT
    count, written = path.read_bytes(), (path.stat().st_ino, path.stat().st_mtime_ns)
    restarted = int8_loop(tmp_path, transport, log)
    restarted.start()
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == written, log.warnings  # not again
    assert restarted.publisher.keyframe.step == 0
    restarted.republish()  # the same step again: the same keyframe, the same bytes
    assert (
        json.loads((tmp_path / "repo" / STEP_COUNT).read_bytes())["weights_sha256"]
        == (json.loads(count)["weights_sha256"])
    )


@pytest.mark.parametrize(("first", "then"), [("int4", "int8"), ("int8", "fp32"), ("fp32", "int8")])
def test_I3_a_master_refuses_another_global_dtype_at_start(tmp_path, first, then):
    """Issue 46: accepted, the switch published other weights under the saved step (or tripped
    the state's own I3 guard and looped); refused in one line, the repo left as it was."""
    transport = LocalTransport(tmp_path / "repo")
    first_loop = int8_loop(tmp_path, transport, dtype=first)
    first_loop.start()
    step_to(first_loop, 1, 0.7)
    repo = {p: p.read_bytes() for p in (tmp_path / "repo").rglob("*") if p.is_file()}
    refused = f"distributed.global_dtype: {first} -> {then} cannot change within a run"
    with pytest.raises(ConfigError, match=refused) as caught:
        int8_loop(tmp_path, transport, dtype=then).start()
    assert "\n" not in str(caught.value) and f"back to {first}" in caught.value.hint
    # the trainer checkpoint's copy says the same, for a master whose state_dir is lost
    copy = MasterPlugin(first_loop).state_dict()
    plugin = MasterPlugin(int8_loop(tmp_path, transport, state="elsewhere", dtype=then))
    plugin.load_state_dict(copy)
    with pytest.raises(ConfigError, match=refused):
        plugin.loop.start(plugin.restored)
    assert {p: p.read_bytes() for p in (tmp_path / "repo").rglob("*") if p.is_file()} == repo


def lose_by_deleting(path):
    path.unlink()


def lose_by_flipping_a_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def lose_by_replacing(path):
    other = as_keyframe({"weight": torch.full((1, 2), 5.0)}, 0)
    path.write_bytes(other.data)


@pytest.mark.parametrize("lose", [lose_by_deleting, lose_by_flipping_a_byte, lose_by_replacing])
def test_I3_a_lost_keyframe_is_uploaded_again_from_the_masters_state(tmp_path, lose):
    """Issue 46: the master published on a keyframe the repo no longer held, so no node could
    read a global again. The periodic look covers the keyframe; named once, then restored."""
    transport, log = LocalTransport(tmp_path / "repo"), Log()
    loop = int8_loop(tmp_path, transport, log)
    loop.start()
    step_to(loop, 1, 0.7)  # an update on keyframe 0
    path = tmp_path / "repo" / loop.publisher.keyframe.path
    lose(path)
    with pytest.raises(BadDelta):
        GlobalReader(transport, {"weight": torch.zeros(1, 2)}).read(1 << 20)
    for _ in range(3):  # the next look restores it, and says so once
        loop.guard.last_check = -float("inf")
        loop.poll_once()
    assert path.read_bytes() == loop.publisher.keyframe.data
    read = GlobalReader(transport, {"weight": torch.zeros(1, 2)}).read(1 << 20)
    assert read.outer_step == 1 and torch.allclose(read.weights["weight"], torch.full((1, 2), 0.7))
    said = [w for w in log.warnings if "uploading it again" in w]
    assert len(said) == 1 and loop.publisher.keyframe.path in said[0], log.warnings


def test_I2_a_node_that_cannot_read_the_global_keeps_its_work_until_it_can(tmp_path):
    """Issue 46: a cold worker that could not read the global (its keyframe lost) sent deltas
    of its own weights as based on outer step 0, and the master dropped every one as too
    stale. It keeps them until it reads a global, carries them onto it, and they count."""
    transport, log = LocalTransport(tmp_path / "repo"), Log()
    loop = int8_loop(tmp_path, transport, log)
    loop.start()
    for step in range(1, 7):  # past max_staleness (4) from outer step 0
        step_to(loop, step, 1.0 + step / 10)
    (tmp_path / "repo" / loop.publisher.keyframe.path).unlink()
    net = model(1.0)
    worker, trainer = WorkerPlugin(settings(), net, transport, Log()), FakeTrainer(net, 10)
    worker.on_train_start(trainer)
    assert worker.base_outer_step == -1  # the global is unreadable: its own weights
    for _ in range(4):  # two boundaries on its own weights
        trainer.train_step(worker, move=-0.1)
    worker.uploader.drain(5.0)
    loop.guard.last_check = -float("inf")
    rounds = [loop.poll_once()]  # the master restores its keyframe
    worker.fetcher.refresh()
    for _ in range(4):  # a boundary installs the global, carrying the work; the next sends it
        trainer.train_step(worker, move=-0.1)
    assert worker.base_outer_step == 6
    worker.uploader.drain(5.0)
    rounds.append(loop.poll_once())
    worker.on_train_end(trainer, None)
    assert not [w for w in log.warnings if "too stale" in w], log.warnings
    [applied] = [r for r in rounds if r is not None and r.included]
    header = loop.intake.nodes["node-a"]
    assert header["base_outer_step"] == 6 and header["steps_total"] == 8, header
    assert applied.outer_step == 7


def fleet_after_one_inner_loop(tmp_path, max_steps, move=-0.25):
    """An int8 master and a worker whose first boundary's delta has landed in the repo."""
    transport = LocalTransport(tmp_path / "repo")
    loop = int8_loop(tmp_path, transport)
    loop.start()
    net = model(1.0)
    worker, trainer = WorkerPlugin(settings(), net, transport, Log()), FakeTrainer(net, max_steps)
    worker.on_train_start(trainer)
    trainer.train_step(worker, move=move)
    trainer.train_step(worker, move=move)  # a boundary: its delta goes up
    worker.uploader.drain(5.0)
    return transport, loop, worker, trainer


def test_a_worker_installs_the_updated_global_as_every_node_reads_it(tmp_path):
    _, loop, worker, trainer = fleet_after_one_inner_loop(tmp_path, 4)
    assert loop.poll_once().outer_step == 1
    expected = loop.publisher.as_published(loop.master.global_weights, 1)
    worker.fetcher.refresh()
    trainer.train_step(worker)
    trainer.train_step(worker)  # the next boundary installs the global
    assert worker.base_outer_step == 1
    assert torch.equal(worker.base["weight"], expected["weight"])
    worker.on_train_end(trainer, None)


def test_the_runs_last_round_publishes_a_keyframe_so_it_ends_exact(tmp_path):
    transport, loop, worker, trainer = fleet_after_one_inner_loop(tmp_path, 2, move=-0.3)
    assert loop.poll_once(force=True).outer_step == 1
    assert loop.publisher.keyframe.step == 1
    read = GlobalReader(transport, {"weight": torch.zeros(1, 2)}).read(1 << 20)
    assert torch.equal(read.weights["weight"], loop.master.global_weights["weight"])
    worker.on_train_end(trainer, None)


def test_a_run_whose_last_round_ran_before_its_end_still_ends_on_a_keyframe(tmp_path):
    """Issue 46: the last round ran in the background (an update on an older keyframe), so the
    end found nothing pending; the final global must still be the master's weights exactly."""
    from speedtronic.distributed.master.plugin import finish

    transport = LocalTransport(tmp_path / "repo")
    loop = int8_loop(tmp_path, transport)
    loop.start()
    loop.master._weights = {"weight": torch.tensor([[0.7, 0.123]])}  # int8 cannot say it
    loop.master._step = 1
    loop.republish()  # an update on keyframe 0
    finish(loop)
    read = GlobalReader(transport, {"weight": torch.zeros(1, 2)}).read(1 << 20)
    assert read.outer_step == 2 and loop.publisher.keyframe.step == 2
    assert torch.equal(read.weights["weight"], loop.master.global_weights["weight"])
    assert torch.equal(read.weights["weight"], torch.tensor([[0.7, 0.123]]))
    assert keyframes(tmp_path) == [loop.publisher.keyframe.path.split("/")[-1]]


def test_validate_says_what_the_global_costs_a_round(tiny, tmp_path):
    from cli.test_cli import invoke, write

    tiny["distributed"] = {"enabled": True, "repo_id": str(tmp_path / "repo"), "node_id": "a"}
    full = json.loads(invoke("validate", "-c", write(tmp_path, tiny), "--format", "json").stdout)
    assert "full fp32 weights" in full["facts"]["diloco_global"]
    assert "global_dtype int8 cuts it" in full["facts"]["diloco_global"]
    tiny["distributed"]["global_dtype"] = "int8"
    doc = json.loads(invoke("validate", "-c", write(tmp_path, tiny), "--format", "json").stdout)
    line = doc["facts"]["diloco_global"]
    assert "an int8 update, a keyframe every 10 rounds" in line and "of an inner loop" in line


def test_a_rounds_global_bytes_count_the_keyframes_share():
    from speedtronic.distributed.global_update import global_bytes_per_round

    ref = {"w": torch.zeros(1024, 128)}  # 131072 values: 1024 blocks
    assert global_bytes_per_round(ref, "fp32", 10) == 4 * 131072
    int8 = global_bytes_per_round(ref, "int8", 10)
    assert int8 == 131072 + 4 * 1024 + 4 * 131072 // 10  # codes, scales, a tenth of a keyframe

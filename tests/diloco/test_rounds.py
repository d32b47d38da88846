"""The round without a publish (issue 54, ``distributed.global_dtype: deltas``): the round record
round-trips and is refused when malformed (I4), the master and a node compute the same bits
with the one ``apply_round``, deltas stay until a keyframe covers them, and the faults a node
meets (a delta deleted, damaged or never there, a result that disagrees, a restart mid-replay)
are named in one line and end with the node back on the master's weights."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from datetime import datetime, timezone

import pytest
import torch
from diloco_support import Log, settings

from speedtronic.distributed import round_apply
from speedtronic.distributed.codec import BadDelta, encode_delta
from speedtronic.distributed.global_update import GlobalReader, round_chain
from speedtronic.distributed.master.loop import MasterLoop
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, KEYFRAMES_DIR, DeltaHeader
from speedtronic.distributed.round_apply import encode_round_file, weights_sha256
from speedtronic.distributed.round_record import (
    CHAIN_KEY,
    Round,
    RoundChain,
    RoundDelta,
    parse_chain,
)
from speedtronic.distributed.transport import LocalTransport
from speedtronic.errors import ConfigError

SHA = "ab" * 32


def reference() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {"embed.weight": torch.randn(40, 16, generator=gen), "ln.weight": torch.ones(7)}


def chain() -> RoundChain:
    one = Round(3, 1.5, (RoundDelta("nodes/a/delta_00000001.safetensors", SHA, 100, 0.25),), SHA)
    two = Round(
        4,
        1.0,
        (
            RoundDelta("nodes/a/delta_00000002.safetensors", SHA, 90, 1 / 3),
            RoundDelta("nodes/b-2/delta_7.safetensors", "cd" * 32, 91, 2e-9),
        ),
        "ef" * 32,
    )
    return RoundChain(4, 2, SHA, (one, two))


def test_a_round_record_round_trips_through_its_file():
    data = encode_round_file(chain())
    assert round_chain(data, reference()) == chain()
    assert parse_chain(chain().to_metadata()) == chain()
    assert encode_round_file(chain()) == data  # canonical: a republish gives the same bytes


def broken(change):
    meta = chain().to_metadata()
    change(meta)
    return meta


def edit_rounds(edit):
    import json

    def change(meta):
        rounds = json.loads(meta[CHAIN_KEY])
        edit(rounds)
        meta[CHAIN_KEY] = json.dumps(rounds)

    return change


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda m: m.update(format="speedtronic-rounds-9"), "round record format"),
        (lambda m: m.update(outer_step="5"), "do not reach outer step 5"),
        (lambda m: m.update(keyframe_sha256="AB" * 32), "keyframe_sha256"),
        (lambda m: m.update(rounds="[{"), "not valid JSON"),
        (lambda m: m.pop("rounds"), "rounds: missing"),
        (edit_rounds(lambda r: r[0].update(outer_step=4)), "says outer step 4"),
        (edit_rounds(lambda r: r[0].update(lr=0)), "lr 0.0: must be > 0"),
        (edit_rounds(lambda r: r[0].update(lr=True)), "must be a finite number"),
        (edit_rounds(lambda r: r[0].update(extra=1)), "must be an object with"),
        (edit_rounds(lambda r: r[0].update(deltas={})), "at most 4096 deltas"),
        (edit_rounds(lambda r: r[0]["deltas"][0].update(coef="0.5")), "finite number"),
        (edit_rounds(lambda r: r[0]["deltas"][0].update(bytes=-1)), "positive integer"),
        (edit_rounds(lambda r: r[0]["deltas"][0].update(sha256="x")), "64 lowercase hex"),
        (
            edit_rounds(lambda r: r[0]["deltas"][0].update(path="global/latest.safetensors")),
            "delta path",
        ),
        (edit_rounds(lambda r: r[1]["deltas"].append(r[1]["deltas"][0])), "named twice"),
    ],
)
def test_I4_a_malformed_round_record_is_refused_by_field(change, match):
    with pytest.raises(BadDelta, match=match):
        parse_chain(broken(change))


def test_I4_a_non_finite_coefficient_is_refused():
    meta = chain().to_metadata()
    meta[CHAIN_KEY] = meta[CHAIN_KEY].replace('"coef":0.25', '"coef":NaN')
    with pytest.raises(BadDelta, match="NaN is not a number JSON allows"):
        parse_chain(meta)


def test_deltas_mode_refuses_outer_momentum(tmp_path):
    from speedtronic.config.distributed import DistributedConfig

    rule = "distributed.outer_momentum: must be 0 with global_dtype deltas"
    with pytest.raises(ConfigError, match=rule):
        master_loop(tmp_path, LocalTransport(tmp_path / "repo"), outer_momentum=0.9).start()
    config = DistributedConfig(global_dtype="deltas", outer_momentum=0.9, node_id="a")
    assert any(p.startswith(rule) for p in config.check())


# ---- a master publishing round records, nodes replaying them -------------------------------


def master_loop(tmp, transport, **overrides):
    options = dict(global_dtype="deltas", keyframe_every=3, min_deltas=2, **overrides)
    state = None if tmp is None else tmp / "state"
    return MasterLoop(settings(**options), reference(), transport, Log(), state)


def send(transport, node, seq, base, seed, tokens=10, steps=2, encoding="int2"):
    """An int2 delta of ``node`` in the repo, as a worker uploads it."""
    gen = torch.Generator().manual_seed(seed)
    delta = {k: 0.01 * torch.randn(v.shape, generator=gen) for k, v in reference().items()}
    created = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    header = DeltaHeader(node, seq, base, steps, tokens, encoding, created)
    path = f"nodes/{node}/delta_{seq:08d}.safetensors"
    transport.upload(path, encode_delta(delta, header))
    return path


def run_round(loop, transport, step, seeds, tokens=(10, 30)):
    """Nodes a and b send a delta each on ``step - 1``; the master takes them as ``step``."""
    paths = [
        send(transport, node, step, step - 1, seed, tokens=t)
        for node, seed, t in zip(("a", "b"), seeds, tokens, strict=True)
    ]
    result = loop.poll_once()
    assert result is not None and result.outer_step == step
    return paths


@pytest.fixture
def fleet(tmp_path):
    transport = LocalTransport(tmp_path / "repo")
    loop = master_loop(tmp_path, transport)
    loop.start()
    return transport, loop


def exact(weights, expected) -> bool:
    return all(torch.equal(weights[k], expected[k]) for k in expected)


def test_master_and_node_agree_bit_for_bit_and_deltas_stay_until_a_keyframe(fleet, tmp_path):
    transport, loop = fleet
    node = GlobalReader(transport, reference())  # a node that reads every round
    sent = []
    for step in (1, 2):
        sent += run_round(loop, transport, step, (step, 10 + step))
        read = node.read(1 << 24)
        assert read.outer_step == step and exact(read.weights, loop.master.global_weights)
        assert read.replayed  # the master's weights: a worker's end need not wait for a keyframe
        assert all((tmp_path / "repo" / p).exists() for p in sent)  # nodes may replay them
    assert node.replayer.counts == {"rounds_applied": 2, "rounds_refused": 0, "round_mismatches": 0}
    late = GlobalReader(transport, reference())  # a node that joins now: keyframe, then replay
    assert exact(late.read(1 << 24).weights, loop.master.global_weights)
    sent += run_round(loop, transport, 3, (3, 13))  # keyframe_every 3: step 3 is a keyframe
    assert len(list((tmp_path / "repo" / KEYFRAMES_DIR).iterdir())) == 1  # 0's deleted
    assert exact(node.read(1 << 24).weights, loop.master.global_weights)
    assert node.replayer.counts["rounds_applied"] == 3  # in step: round 3 replayed, no keyframe
    cold = GlobalReader(transport, reference())
    assert exact(cold.read(1 << 24).weights, loop.master.global_weights)  # the keyframe
    assert cold.replayer.counts["rounds_applied"] == 0
    assert all((tmp_path / "repo" / p).exists() for p in sent)
    run_round(loop, transport, 4, (4, 14))  # the first record not naming them deletes them
    assert not any((tmp_path / "repo" / p).exists() for p in sent)
    assert exact(node.read(1 << 24).weights, loop.master.global_weights)
    record = (tmp_path / "repo" / GLOBAL_WEIGHTS).stat().st_size
    assert record < 4096  # the round record, not weights


def test_a_rounds_coefficients_are_the_fleet_policy(fleet):
    transport, loop = fleet
    run_round(loop, transport, 1, (1, 2), tokens=(10, 30))
    chain = round_chain(transport.read(GLOBAL_WEIGHTS, 1 << 20), reference())
    coefs = [d.coef for d in chain.rounds[0].deltas]
    assert coefs == pytest.approx([0.25, 0.75])  # tokens per step 5 and 15: a quarter each way
    assert chain.rounds[0].weights_sha256 == weights_sha256(loop.master.global_weights)


def test_a_restarted_master_publishes_the_same_record(fleet, tmp_path):
    transport, loop = fleet
    run_round(loop, transport, 1, (1, 2))
    data = transport.read(GLOBAL_WEIGHTS, 1 << 20)
    read = GlobalReader(transport, reference(), hashed=True).read(1 << 24)  # a master's look
    assert read.sha256 == hashlib.sha256(data).hexdigest()  # the record file's, as published
    again = master_loop(tmp_path, transport)
    again.start()
    assert not again.logger.warnings  # the repo holds its step as saved: no "damaged" line
    again.republish()
    assert transport.read(GLOBAL_WEIGHTS, 1 << 20) == data
    assert again.publisher.chain == loop.publisher.chain


# ---- faults a node meets -----------------------------------------------------------------


def two_rounds(fleet):
    transport, loop = fleet
    return (
        transport,
        loop,
        run_round(loop, transport, 1, (1, 2)) + run_round(loop, transport, 2, (3, 4)),
    )


def recovers_at_the_next_keyframe(node, transport, loop):
    run_round(loop, transport, 3, (5, 6))  # keyframe_every 3
    assert exact(node.read(1 << 24).weights, loop.master.global_weights)


def test_a_delta_deleted_before_a_node_fetched_it_is_named_then_the_keyframe_heals(fleet, tmp_path):
    transport, loop, paths = two_rounds(fleet)
    (tmp_path / "repo" / paths[2]).unlink()
    node = GlobalReader(transport, reference())
    with pytest.raises(BadDelta, match=f"outer step 2 not applied: {paths[2]} is missing"):
        node.read(1 << 24)
    with pytest.raises(BadDelta, match=f"outer step 2 not applied: {paths[2]} is missing"):
        node.read(1 << 24)  # not downloaded again each poll: the same line
    assert node.replayer.counts["rounds_refused"] == 1
    assert node.replayer.step == 1  # round 1 verified, round 2 not half applied
    recovers_at_the_next_keyframe(node, transport, loop)


def test_a_damaged_delta_is_named(fleet, tmp_path):
    transport, loop, paths = two_rounds(fleet)
    path = tmp_path / "repo" / paths[0]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    node = GlobalReader(transport, reference())
    with pytest.raises(BadDelta, match=f"{paths[0]} is not the delta the record names"):
        node.read(1 << 24)
    recovers_at_the_next_keyframe(node, transport, loop)


def test_I4_a_record_naming_a_delta_that_never_existed_or_an_oversize_one_is_refused(fleet):
    transport, loop, _ = two_rounds(fleet)
    real = round_chain(transport.read(GLOBAL_WEIGHTS, 1 << 20), reference())
    ghost = RoundDelta("nodes/ghost/delta_00000009.safetensors", SHA, 100, 0.5)
    forged = replace(real, rounds=(real.rounds[0], replace(real.rounds[1], deltas=(ghost,))))
    transport.publish(encode_round_file(forged), {"outer_step": 2, "format": 1}, [])
    with pytest.raises(BadDelta, match="nodes/ghost/delta_00000009.safetensors is missing"):
        GlobalReader(transport, reference()).read(1 << 24)
    small = replace(real.rounds[1].deltas[0], size=10)  # the file is larger than named
    forged = replace(real, rounds=(real.rounds[0], replace(real.rounds[1], deltas=(small,))))
    transport.publish(encode_round_file(forged), {"outer_step": 2, "format": 1}, [])
    with pytest.raises(BadDelta, match=f"{small.path} cannot be read .*over the 10 cap"):
        GlobalReader(transport, reference()).read(1 << 24)


def test_a_node_whose_result_disagrees_says_so_counts_it_and_reanchors(fleet, monkeypatch):
    transport, loop, _ = two_rounds(fleet)
    node = GlobalReader(transport, reference())
    honest = round_apply.apply_round

    def off_by_one_ulp(weights, parts, lr):  # another CPU's rounding, forced
        out = honest(weights, parts, lr)
        out["ln.weight"] = torch.nextafter(out["ln.weight"], torch.full_like(out["ln.weight"], 9))
        return out

    monkeypatch.setattr(round_apply, "apply_round", off_by_one_ulp)  # the node's, not the master's
    with pytest.raises(BadDelta, match="outer step 1 not applied: the weights this node computed"):
        node.read(1 << 24)
    assert node.replayer.counts["round_mismatches"] == 1
    monkeypatch.setattr(round_apply, "apply_round", honest)
    with pytest.raises(BadDelta, match="outer step 1 not applied: the weights this node"):
        node.read(1 << 24)  # never the disagreeing weights, never round 2 on top of them
    recovers_at_the_next_keyframe(node, transport, loop)


def test_a_node_restarted_mid_replay_replays_from_the_keyframe_once(fleet, monkeypatch):
    transport, loop, paths = two_rounds(fleet)
    node = GlobalReader(transport, reference())
    real_read = transport.read

    def dies_on(path, cap):  # the node is killed while it downloads round 2's first delta
        if path == paths[2]:
            raise KeyboardInterrupt
        return real_read(path, cap)

    monkeypatch.setattr(transport, "read", dies_on)
    with pytest.raises(KeyboardInterrupt):
        node.read(1 << 24)
    assert node.replayer.step == 1 and node.replayer.counts["rounds_applied"] == 1
    monkeypatch.setattr(transport, "read", real_read)
    assert exact(node.read(1 << 24).weights, loop.master.global_weights)  # resumes at round 2
    assert node.replayer.counts["rounds_applied"] == 2  # nothing applied twice
    restarted = GlobalReader(transport, reference())  # a new process: from the keyframe
    assert exact(restarted.read(1 << 24).weights, loop.master.global_weights)
    assert restarted.replayer.counts["rounds_applied"] == 2


def test_validate_says_what_a_round_costs_each_way(tiny, tmp_path):
    from cli.test_cli import invoke, write

    tiny["distributed"] = {
        "enabled": True,
        "repo_id": str(tmp_path / "repo"),
        "node_id": "a",
        "global_dtype": "deltas",
        "delta_dtype": "int2",
    }
    doc = json.loads(invoke("validate", "-c", write(tmp_path, tiny), "--format", "json").stdout)
    line = doc["facts"]["diloco_global"]
    assert "per round a node with 4 nodes (the 3 others' int2 deltas and the round record" in line
    assert "the master uploads" in line and "a keyframe every 10 rounds" in line, line


def test_a_round_costs_a_node_the_others_deltas_and_the_master_a_share_of_a_keyframe():
    ref = {"w": torch.zeros(1024, 128)}  # 131072 values: 1024 blocks
    got = round_apply.deltas_bytes_per_round(ref, "int2", 4, 10)
    int2 = 131072 // 4 + 4 * 1024  # codes and scales
    record = round_apply.RECORD_BYTES + round_apply.RECORD_BYTES_PER_DELTA * 40
    assert got == {"node_up": int2, "node_down": 3 * int2 + record, "master_up": record + 52428}


def test_a_master_restarted_between_a_record_and_its_keyframe_publishes_it_whole(
    fleet, tmp_path, monkeypatch
):
    from speedtronic.errors import TransportError

    transport, loop, sent = two_rounds(fleet)
    node = GlobalReader(transport, reference())
    node.read(1 << 24)  # in step at outer step 2
    real_publish = transport.publish

    def killed(*args):  # the master dies after saving step 3 (a keyframe), before its publish
        raise TransportError("killed")

    monkeypatch.setattr(transport, "publish", killed)
    sent += [send(transport, n, 3, 2, seed) for n, seed in (("a", 5), ("b", 6))]
    with pytest.raises(TransportError):
        loop.poll_once()
    monkeypatch.setattr(transport, "publish", real_publish)
    restarted = master_loop(tmp_path, transport)
    restarted.start()  # its saved step 3 is ahead of the repo's 2: published again, whole
    read = node.read(1 << 24)
    assert read.outer_step == 3 and exact(read.weights, loop.master.global_weights)
    assert node.replayer.counts["rounds_applied"] == 3  # round 3 replayed, once
    assert exact(GlobalReader(transport, reference()).read(1 << 24).weights, read.weights)
    assert all((tmp_path / "repo" / p).exists() for p in sent)  # nodes behind replay them
    send(transport, "a", 4, 3, 7)
    send(transport, "b", 4, 3, 8)
    assert restarted.poll_once().outer_step == 4
    assert not any((tmp_path / "repo" / p).exists() for p in sent)  # the restored chain's
    assert exact(node.read(1 << 24).weights, restarted.master.global_weights)


def test_a_workers_fetcher_names_a_refused_round_once_a_minute_and_counts_it(fleet, tmp_path):
    from speedtronic.distributed.node_status import NodeStatus
    from speedtronic.distributed.worker.fetch import GlobalFetcher

    transport, loop, paths = two_rounds(fleet)
    (tmp_path / "repo" / paths[3]).unlink()
    log, status = Log(), NodeStatus()
    fetcher = GlobalFetcher(settings(node_id="c"), transport, log, status, reference())
    fetcher.refresh()
    fetcher.refresh()  # the same failure: not said again, not downloaded again
    assert len(log.warnings) == 1 and f"{paths[3]} is missing" in log.warnings[0], log.warnings
    assert fetcher.ready is None and fetcher.unread == 2
    assert status.counters["rounds_refused"] == 1 and status.counters["rounds_applied"] == 1
    run_round(loop, transport, 3, (5, 6))  # the keyframe past it
    fetcher.refresh()
    assert fetcher.ready.outer_step == 3 and exact(
        fetcher.ready.weights, loop.master.global_weights
    )


def test_a_worker_replays_its_own_delta_from_what_it_sent_not_from_the_repo(tmp_path):
    from speedtronic.distributed.worker.plugin import WorkerPlugin
    from tests.diloco.test_global_update import int8_loop
    from tests.diloco.test_nodes import FakeTrainer, model

    transport = LocalTransport(tmp_path / "repo")
    loop = int8_loop(tmp_path, transport, dtype="deltas")
    loop.start()
    net = model(1.0)
    worker, trainer = WorkerPlugin(settings(), net, transport, Log()), FakeTrainer(net, 4)
    worker.on_train_start(trainer)
    trainer.train_step(worker)
    trainer.train_step(worker)  # a boundary: its delta goes up
    worker.uploader.drain(5.0)
    assert loop.poll_once().outer_step == 1
    paths, real_read = [], transport.read
    transport.read = lambda path, cap: paths.append(path) or real_read(path, cap)
    worker.fetcher.refresh()
    ready = worker.fetcher.ready
    assert ready.outer_step == 1 and exact(ready.weights, loop.master.global_weights)
    assert not [p for p in paths if p.startswith("nodes/")], paths  # held: not downloaded
    assert worker.status.counters["rounds_applied"] == 1
    worker.on_train_end(trainer, None)

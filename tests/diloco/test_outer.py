"""The master's policy and state (speedtronic.distributed.master.outer), named after the invariants.

Expected numbers are computed by hand in each test, never by calling the code under test.
Tensors are tiny: the whole file runs in about a second on a CPU.
"""

from __future__ import annotations

import json
import warnings

import pytest
import safetensors.torch
import torch

from speedtronic.distributed.master import state as master_state
from speedtronic.distributed.master.outer import (
    Master,
    MasterConfig,
    MasterState,
    OuterOptimizer,
    ReceivedDelta,
    aggregate,
    delta_identity,
)
from speedtronic.distributed.protocol import BadDelta, DeltaHeader
from speedtronic.errors import CheckpointError, ConfigError

W0 = {"a": [1.0, 2.0], "b": [0.5]}


def tensors(values: dict) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(v, dtype=torch.float32) for k, v in values.items()}


def make_delta(node: str, seq: int, base: int, tokens: int, a, b, chain="") -> ReceivedDelta:
    """A delta as the coordinator would hand it over, identity from the file's bytes."""
    header = DeltaHeader(node, seq, base, 10, tokens, "fp32", "2024-01-01T00:00:00Z", chain)
    values = tensors({"a": a, "b": b})
    data = safetensors.torch.save(values, metadata=header.to_metadata())
    return ReceivedDelta(delta_identity(node, seq, data), header, values)


def master(state_step: int = 0, **config) -> Master:
    """A master with momentum (DiLoCo's 0.7 / 0.9) unless told otherwise: most tests need it."""
    config = {"outer_lr": 0.7, "outer_momentum": 0.9, **config}
    state = MasterState(state_step, tensors(W0)) if state_step else None
    return Master(MasterConfig(**config), tensors(W0), state)


def assert_weights(weights, expected: dict) -> None:
    for key, value in expected.items():
        torch.testing.assert_close(weights[key], torch.tensor(value), rtol=0, atol=1e-6)


# Three deltas at outer step 3 with discount 0.5 and cut-off 2: weights 100 * 1, 200 * 0.5 and
# 200 * 0.25, i.e. 100 : 100 : 50, total 250. Mean a = (100*[1,0] + 100*[0,4] + 50*[8,8]) / 250
# = [2.0, 3.2]; mean b = (100*2 - 100*2 + 50*8) / 250 = 1.6.
FRESH = ("n1", 1, 3, 100, [1.0, 0.0], [2.0])
ONE_BEHIND = ("n2", 1, 2, 200, [0.0, 4.0], [-2.0])
TWO_BEHIND = ("n3", 1, 1, 200, [8.0, 8.0], [8.0])
TOO_STALE = ("n4", 1, 0, 1000, [100.0, 100.0], [100.0])


def test_aggregate_is_the_token_weighted_mean_with_staleness_discount():
    deltas = [make_delta(*d) for d in (FRESH, ONE_BEHIND, TWO_BEHIND, TOO_STALE)]
    got = aggregate(deltas, outer_step=3, max_staleness=2, staleness_discount=0.5)
    assert got.included == [d.identity for d in deltas[:3]]
    assert got.stale == [deltas[3].identity] and got.bad == {}
    assert got.node_weights == {"n1": 10.0, "n2": 10.0, "n3": 5.0}  # tokens per step (10 steps)
    assert got.tokens == 500
    assert_weights(got.mean, {"a": [2.0, 3.2], "b": [1.6]})


def test_round_applies_the_weighted_mean_as_one_nesterov_step():
    m = master(3, outer_lr=0.5, outer_momentum=0.9, min_deltas=3, max_staleness=2)
    for spec in (FRESH, ONE_BEHIND, TWO_BEHIND):
        assert m.offer(make_delta(*spec), now=0.0) == "accepted"
    result = m.round(now=0.0)
    # Buffer from zero: buf = g, update = g + 0.9 g = 1.9 g, w -= 0.5 * 1.9 g = 0.95 g.
    # a = [1 - 0.95*2, 2 - 0.95*3.2] = [-0.9, -1.04]; b = 0.5 - 0.95*1.6 = -1.02.
    assert_weights(result.weights, {"a": [-0.9, -1.04], "b": [-1.02]})
    assert_weights(m.global_weights, {"a": [-0.9, -1.04], "b": [-1.02]})
    assert result.outer_step == m.outer_step == 4
    assert result.momentum_applied and result.counts == {"included": 3, "stale": 0, "bad": 0}


def test_round_weights_are_a_copy_that_later_rounds_do_not_change():
    m = master(min_deltas=1, outer_momentum=0.0)
    m.offer(make_delta("n1", 1, 0, 10, [1.0, 1.0], [1.0]), now=0.0)
    first = m.round(now=0.0)
    m.offer(make_delta("n1", 2, 1, 10, [1.0, 1.0], [1.0]), now=0.0)
    m.round(now=0.0)
    assert_weights(first.weights, {"a": [0.3, 1.3], "b": [-0.2]})  # 0.7 * 1 taken once


def test_stale_cut_off_rejects_and_counts_deltas_beyond_max_staleness():
    m = master(3, min_deltas=1, max_staleness=2, outer_momentum=0.0)
    stale, edge = make_delta(*TOO_STALE), make_delta(*TWO_BEHIND)  # staleness 3 and 2
    assert m.offer(stale, now=0.0) == "stale"
    assert m.offer(edge, now=0.0) == "accepted"
    result = m.round(now=0.0)
    assert result.stale == [stale.identity] and result.included == [edge.identity]
    assert set(result.consumed) == {stale.identity, edge.identity}
    assert m.offer(stale, now=1.0) == "duplicate"  # settled: never counted again


def test_delta_from_the_future_is_rejected_as_bad():
    future = make_delta("n1", 1, 4, 100, [1.0, 1.0], [1.0])
    got = aggregate([future], outer_step=3, max_staleness=2, staleness_discount=0.5)
    assert got.included == [] and got.mean == {} and "ahead" in got.bad[future.identity]
    m = master(3, min_deltas=1, outer_momentum=0.0)
    with pytest.raises(BadDelta, match="base_outer_step 4 is ahead of outer step 3"):
        m.offer(future, now=0.0)
    assert m.offer(future, now=0.0) == "duplicate" and m.pending == 0
    m.offer(make_delta(*FRESH), now=0.0)
    assert m.round(now=0.0).bad == {future.identity: "base_outer_step 4 is ahead of outer step 3"}


def test_delta_that_does_not_fit_the_model_is_bad():
    m = master(min_deltas=1, outer_momentum=0.0)
    wrong = make_delta("n1", 1, 0, 10, [1.0, 2.0, 3.0], [1.0])
    with pytest.raises(BadDelta, match=r"'a' has shape \(3,\), expected \(2,\)"):
        m.offer(wrong, now=0.0)
    with pytest.raises(BadDelta, match="trained on 0 tokens"):
        m.offer(make_delta("n1", 2, 0, 0, [1.0, 2.0], [1.0]), now=0.0)


def test_quorum_waits_for_min_deltas():
    m = master(min_deltas=2, max_wait_s=60.0)
    m.offer(make_delta("n1", 1, 0, 10, [1.0, 1.0], [1.0]), now=0.0)
    assert not m.ready(now=30.0) and m.round(now=30.0) is None
    m.offer(make_delta("n2", 1, 0, 10, [1.0, 1.0], [1.0]), now=31.0)
    assert m.ready(now=31.0)
    assert m.round(now=31.0).momentum_applied


def test_max_wait_releases_a_partial_round():
    m = master(min_deltas=2, max_wait_s=60.0, outer_lr=0.5, outer_momentum=0.0)
    assert not m.ready(now=0.0) and m.round(now=0.0, force=True) is None  # nothing pending
    m.offer(make_delta("n1", 1, 0, 10, [2.0, 2.0], [2.0]), now=100.0)
    assert not m.ready(now=159.9) and m.ready(now=160.0)  # injected clock, from first arrival
    # The only node known so far is the whole fleet: w -= 0.5 * 2 -> a = [0, 1], b = -0.5.
    assert_weights(m.round(now=160.0).weights, {"a": [0.0, 1.0], "b": [-0.5]})


def test_a_round_of_part_of_the_fleet_applies_its_share_and_momentum_once_per_fleet_loop():
    m = master(min_deltas=1, outer_lr=1.0, outer_momentum=0.5, staleness_discount=1.0)
    m.offer(make_delta("n1", 1, 0, 10, [1.0, 1.0], [1.0]), now=0.0)
    m.offer(make_delta("n2", 1, 0, 10, [1.0, 1.0], [1.0]), now=0.0)
    # Both nodes: plain Nesterov from a zero buffer: buf = 1, w -= 1 * (1 + 0.5 * 1) = 1.5.
    first = m.round(now=0.0)
    assert first.momentum_applied
    assert_weights(first.weights, {"a": [-0.5, 0.5], "b": [-1.0]})
    # n1 alone is half the fleet's tokens: its gradient part at half weight, no momentum yet.
    m.offer(make_delta("n1", 2, 1, 10, [2.0, 2.0], [2.0]), now=1.0)
    half = m.round(now=1.0)
    assert not half.momentum_applied
    assert_weights(half.weights, {"a": [-1.5, -0.5], "b": [-2.0]})
    # n2's half completes a fleet's worth: gradient part 0.5 * 2 = 1, then buf = 0.5 * 1 +
    # (1 + 1) = 2.5 and the look-ahead 1 * 0.5 * 2.5 = 1.25: w -= 2.25 in all.
    m.offer(make_delta("n2", 2, 1, 10, [2.0, 2.0], [2.0]), now=2.0)
    other = m.round(now=2.0)
    assert other.momentum_applied
    assert_weights(other.weights, {"a": [-3.75, -2.75], "b": [-4.25]})


def test_forced_round_takes_a_partial_round_at_the_end_of_training():
    m = master(min_deltas=3, max_wait_s=600.0, outer_lr=1.0, outer_momentum=0.0)
    m.offer(make_delta("n1", 1, 0, 10, [1.0, 1.0], [1.0]), now=0.0)
    assert m.round(now=1.0) is None
    result = m.round(now=1.0, force=True)
    assert result.outer_step == 1 and not result.momentum_applied
    assert_weights(result.weights, {"a": [0.0, 1.0], "b": [-0.5]})


def test_I1_the_same_delta_offered_twice_is_counted_once(tmp_path):
    m = master(min_deltas=1, outer_lr=1.0, outer_momentum=0.0)
    same = make_delta("n1", 7, 0, 10, [1.0, 1.0], [1.0])
    assert m.offer(same, now=0.0) == "accepted"
    assert m.offer(same, now=0.0) == "duplicate"  # while pending
    result = m.round(now=0.0)
    assert result.included == [same.identity]
    assert_weights(result.weights, {"a": [0.0, 1.0], "b": [-0.5]})  # applied once
    assert m.offer(same, now=1.0) == "duplicate"  # after its round
    m.snapshot().save(tmp_path)
    reloaded = Master(m.config, tensors(W0), MasterState.load(tmp_path))
    assert reloaded.offer(same, now=2.0) == "duplicate" and reloaded.pending == 0  # after restart


def test_I1_a_restarted_worker_reusing_a_file_name_is_counted_with_its_new_content():
    m = master(min_deltas=2, outer_lr=1.0, outer_momentum=0.0)
    before = make_delta("n1", 1, 0, 10, [2.0, 0.0], [0.0], chain="aaaaaaaa")
    # same node, same seq, a new chain: it restarted from the global without its checkpoint
    after_restart = make_delta("n1", 1, 0, 10, [0.0, 2.0], [4.0], chain="bbbbbbbb")
    assert before.identity != after_restart.identity
    assert m.offer(before, now=0.0) == "accepted"
    assert m.offer(after_restart, now=0.0) == "accepted"
    result = m.round(now=0.0)
    # Two chains of one node, equal tokens: their mean a = [1, 1], b = 2; w -= mean -> a = [0, 1],
    # b = -1.5.
    assert result.counts["included"] == 2
    assert_weights(result.weights, {"a": [0.0, 1.0], "b": [-1.5]})


def rounds(m: Master, count: int, first_seq: int = 1) -> None:
    """Feed ``count`` full rounds of two distinct, fresh deltas each."""
    for i in range(first_seq, first_seq + count):
        m.offer(make_delta("n1", i, m.outer_step, 10, [1.0 * i, -1.0], [0.5]), now=0.0)
        m.offer(make_delta("n2", i, m.outer_step, 30, [0.0, 2.0 * i], [0.25]), now=0.0)
        assert m.round(now=0.0).momentum_applied


def test_I3_save_load_round_trip(tmp_path):
    m = master(min_deltas=2)
    rounds(m, 2)
    path = m.snapshot().save(tmp_path)
    assert path.name == "step_0000000002.json"
    loaded = MasterState.load(tmp_path)
    assert loaded.outer_step == 2 and loaded.processed == m.snapshot().processed
    for key, weight in m.global_weights.items():
        assert torch.equal(loaded.global_weights[key], weight)
    buffers = m.snapshot().optimizer_state["momentum_buffer"]
    assert buffers and all(
        torch.equal(loaded.optimizer_state["momentum_buffer"][k], t) for k, t in buffers.items()
    )
    manifest = json.loads(path.read_text())
    assert manifest["outer_step"] == 2 and len(manifest["tensors"]["sha256"]) == 64


def test_I3_save_refuses_to_go_back_to_a_lower_outer_step(tmp_path):
    m = master(min_deltas=2)
    rounds(m, 1)
    older = m.snapshot()
    older = MasterState(older.outer_step, {k: t.clone() for k, t in older.global_weights.items()})
    rounds(m, 1, first_seq=2)
    m.snapshot().save(tmp_path)
    with pytest.raises(CheckpointError, match="at outer step 2; refusing to save step 1"):
        older.save(tmp_path)
    assert MasterState.load(tmp_path).outer_step == 2


def test_I3_same_step_may_be_saved_again_but_never_with_other_weights(tmp_path):
    m = master(3, min_deltas=1, max_staleness=2, outer_momentum=0.0)
    m.snapshot().save(tmp_path)
    m.offer(make_delta(*TOO_STALE), now=0.0)  # settles an identity without a new step
    m.snapshot().save(tmp_path)
    assert len(MasterState.load(tmp_path).processed) == 1
    other = MasterState(3, tensors({"a": [9.0, 9.0], "b": [9.0]}))
    with pytest.raises(CheckpointError, match="refusing to save step 3"):
        other.save(tmp_path)


def corrupt(path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def data_file(tmp_path, step: int, kind: str):
    manifest = json.loads((tmp_path / f"step_{step:010d}.json").read_text())
    return tmp_path / manifest[kind]["file"]


@pytest.mark.parametrize("kind", ["tensors", "processed"])
def test_I3_a_damaged_newest_state_falls_back_to_the_previous_good_one(tmp_path, kind):
    m = master(min_deltas=2)
    rounds(m, 1)
    m.snapshot().save(tmp_path)
    rounds(m, 1, first_seq=2)
    m.snapshot().save(tmp_path)
    corrupt(data_file(tmp_path, 2, kind))
    skipped: list[str] = []
    loaded = MasterState.load(tmp_path, log=skipped.append)
    assert loaded.outer_step == 1
    assert len(skipped) == 1 and "does not match its sha256" in skipped[0]
    corrupt(data_file(tmp_path, 1, kind))
    assert MasterState.load(tmp_path, log=skipped.append) is None


def test_I3_a_crash_before_the_manifest_keeps_the_previous_state(tmp_path, monkeypatch):
    m = master(min_deltas=2)
    rounds(m, 1)
    m.snapshot().save(tmp_path)
    rounds(m, 1, first_seq=2)
    write = master_state.replace_atomically

    def crash_on_manifest(path, data):
        if path.name.startswith("step_"):
            raise KeyboardInterrupt  # killed after the data files, before the manifest
        write(path, data)

    monkeypatch.setattr(master_state, "replace_atomically", crash_on_manifest)
    with pytest.raises(KeyboardInterrupt):
        m.snapshot().save(tmp_path)
    assert MasterState.load(tmp_path).outer_step == 1
    monkeypatch.setattr(master_state, "replace_atomically", write)
    m.snapshot().save(tmp_path)
    assert MasterState.load(tmp_path).outer_step == 2


def test_I3_load_of_an_empty_or_missing_dir_is_none(tmp_path):
    assert MasterState.load(tmp_path) is None
    assert MasterState.load(tmp_path / "missing") is None


def test_saves_keep_the_newest_two_states_and_only_their_files(tmp_path):
    m = master(min_deltas=2)
    for seq in range(1, 5):
        rounds(m, 1, first_seq=seq)
        m.snapshot().save(tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert [n for n in names if n.startswith("step_")] == [
        "step_0000000003.json",
        "step_0000000004.json",
    ]
    assert len(names) == 6  # two manifests, each naming a tensors and a processed file


def test_momentum_survives_save_load(tmp_path):
    straight = master(min_deltas=2)
    rounds(straight, 2)
    resumed = master(min_deltas=2)
    rounds(resumed, 1)
    resumed.snapshot().save(tmp_path)
    resumed = Master(resumed.config, tensors(W0), MasterState.load(tmp_path))
    rounds(resumed, 1, first_seq=2)
    forgetful = master(min_deltas=2)  # what a restart that lost the buffer would give
    rounds(forgetful, 1)
    forgetful = Master(forgetful.config, tensors(W0), MasterState(1, forgetful.global_weights))
    rounds(forgetful, 1, first_seq=2)
    for key, weight in straight.global_weights.items():
        assert torch.equal(resumed.global_weights[key], weight)
    assert not torch.equal(forgetful.global_weights["a"], straight.global_weights["a"])


def test_naive_async_mode_is_still_possible_with_a_warning():
    config = dict(min_deltas=1, outer_momentum=0.9, staleness_discount=1.0, outer_lr=1.0)
    config["policy"] = "naive"
    with pytest.warns(UserWarning, match="naive async"):
        m = master(**config)
    # Each delta alone is a full round with momentum, a stale one at full weight.
    m.offer(make_delta("n1", 1, 0, 10, [1.0, 0.0], [0.0]), now=0.0)
    assert m.ready(now=0.0) and m.round(now=0.0).momentum_applied
    m.offer(make_delta("n2", 1, 0, 10, [2.0, 0.0], [0.0]), now=0.0)  # staleness 1
    second = m.round(now=0.0)
    # a[0]: update 1 + 0.9*1 = 1.9; buf = 0.9*1 + 2 = 2.9, update 2 + 0.9*2.9 = 4.61.
    assert second.momentum_applied and second.included
    assert_weights(second.weights, {"a": [1.0 - 1.9 - 4.61, 2.0], "b": [0.5]})


def test_defaults_are_the_stable_policy():
    config = MasterConfig()
    assert (config.outer_lr, config.outer_momentum, config.nesterov) == (1.0, 0.0, True)
    assert config.min_deltas >= 2 and config.staleness_discount < 1
    assert config.max_wait_s > 0 and config.max_staleness >= 1
    assert config.warnings() == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Master(config, tensors(W0))


@pytest.mark.parametrize(
    "key, value",
    [
        ("outer_lr", 0.0),
        ("outer_momentum", 1.0),
        ("min_deltas", 0),
        ("max_wait_s", -1.0),
        ("max_staleness", -1),
        ("staleness_discount", 0.0),
    ],
)
def test_config_rejects_values_out_of_range(key, value):
    with pytest.raises(ConfigError, match=f"distributed.{key}: must be"):
        MasterConfig(**{key: value})


@pytest.mark.parametrize("nesterov", [True, False])
def test_outer_optimizer_is_torch_sgd_on_pseudo_gradients(nesterov):
    gen = torch.Generator().manual_seed(0)
    weights = {"w": torch.randn(3, 4, generator=gen)}
    reference = torch.nn.Parameter(weights["w"].clone())
    sgd = torch.optim.SGD([reference], lr=0.7, momentum=0.9, nesterov=nesterov)
    ours = OuterOptimizer(lr=0.7, momentum=0.9, nesterov=nesterov)
    for _ in range(3):
        grad = torch.randn(3, 4, generator=gen)
        reference.grad = grad.clone()
        sgd.step()
        ours.step(weights, {"w": grad})
    torch.testing.assert_close(weights["w"], reference.detach())


def test_outer_optimizer_hand_computed_steps():
    weights = {"w": torch.zeros(1)}
    nesterov = OuterOptimizer(lr=1.0, momentum=0.9)
    nesterov.step(weights, {"w": torch.ones(1)})
    nesterov.step(weights, {"w": torch.full((1,), 2.0)})
    # 1.9, then buf = 2.9 and update 2 + 2.61 = 4.61.
    assert_weights(weights, {"w": [-6.51]})
    plain = {"w": torch.zeros(1)}
    heavy_ball = OuterOptimizer(lr=1.0, momentum=0.9, nesterov=False)
    heavy_ball.step(plain, {"w": torch.ones(1)})
    heavy_ball.step(plain, {"w": torch.full((1,), 2.0)})
    assert_weights(plain, {"w": [-3.9]})  # buf 1, then 2.9


def test_a_saved_state_that_does_not_fit_the_model_is_refused():
    state = MasterState(1, tensors({"a": [1.0, 2.0, 3.0], "b": [0.5]}))
    with pytest.raises(ValueError, match="saved weights do not fit the model"):
        Master(MasterConfig(), tensors(W0), state)

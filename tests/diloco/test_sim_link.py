"""The convergence simulator's ``bw`` arms (issue 38): transfers cost bytes over a link, so a
smaller encoding uploads sooner, and the global's download and publish are charged too."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def load_sim():
    sys.path.insert(0, str(ROOT / "benchmarks" / "diloco"))
    spec = importlib.util.spec_from_file_location("diloco_sim", ROOT / "benchmarks/diloco/sim.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["diloco_sim"] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


sim = load_sim()
PARAMS = {"w": torch.zeros(256, 128), "b": torch.zeros(128)}


def test_arm_names_pick_the_encoding_error_feedback_and_the_link():
    arm = sim.parse_arm("c_f0.25_eager_keep_muon_bw_int2_noef")
    assert (arm.encoding, arm.feedback, arm.bandwidth, arm.latency) == ("int2", False, True, 0.25)
    plain = sim.parse_arm("c_f0.25")
    assert (plain.encoding, plain.feedback, plain.bandwidth) == ("bf16", True, False)


def test_a_bf16_delta_takes_f_of_an_inner_loop_and_smaller_encodings_less():
    scale = sim.Scale()
    bf16 = sim.link_latency(sim.parse_arm("c_f0.25_bw"), scale, PARAMS)
    int2 = sim.link_latency(sim.parse_arm("c_f0.25_bw_int2"), scale, PARAMS)
    fixed = sim.FIXED_SHARE * scale.loop_s
    assert bf16.upload_s == pytest.approx(fixed + 0.25 * scale.loop_s)
    assert int2.upload_s - fixed == pytest.approx(0.25 * scale.loop_s * 0.140625, rel=0.01)
    # the global is fp32 full weights: twice a bf16 delta, down at 5x the uplink, the
    # master's publish at the uplink
    assert bf16.download_s - fixed == pytest.approx(0.25 * scale.loop_s * 2 / 5)
    assert int2.publish_s - fixed == pytest.approx(0.25 * scale.loop_s * 2)
    assert int2.poll_s == int2.upload_s


def test_the_f_arms_are_unchanged():
    latency = sim.Latency(0.25, 15.0)
    assert (latency.upload_s, latency.publish_s, latency.download_s) == (3.75, 3.75, 1.875)


def test_arm_names_pick_the_globals_encoding_and_keyframe_interval():
    arm = sim.parse_arm("c_f0.25_eager_keep_muon_bw_int2_gint8_kf5")
    assert (arm.global_dtype, arm.keyframe_every) == ("int8", 5)
    assert (sim.parse_arm("c_f0.25").global_dtype, sim.parse_arm("c_f0.25").keyframe_every) == (
        "fp32",
        10,
    )
    with pytest.raises(ValueError, match="kf0"):
        sim.parse_arm("c_f0.25_kf0")


def test_a_publish_and_a_download_are_charged_by_their_bytes_over_a_link():
    scale = sim.Scale()
    link = sim.link_latency(sim.parse_arm("c_f0.25_bw_int2_gint8"), scale, PARAMS)
    fixed = sim.FIXED_SHARE * scale.loop_s
    full = link.link.weights_bytes
    assert link.publish_time(full) == pytest.approx(link.publish_s)
    assert link.publish_time(full // 4) - fixed == pytest.approx((link.publish_s - fixed) / 4)
    assert link.download_time(full // 4) - fixed == pytest.approx((link.download_s - fixed) / 4)
    plain = sim.Latency(0.25, 15.0)  # the f arms: whatever the bytes
    assert (plain.publish_time(1), plain.download_time(10**9)) == (3.75, 1.875)


def test_a_keyframe_lands_with_the_publish_that_names_it_and_its_bytes_are_charged(tmp_path):
    from speedtronic.distributed.protocol import keyframe_path
    from speedtronic.distributed.transport import LocalTransport

    clock = sim.SimClock()
    transport = sim.LatentTransport(LocalTransport(tmp_path / "repo"), clock)
    scale = sim.Scale()
    transport.latency = sim.link_latency(sim.parse_arm("c_f0.25_bw_gint8"), scale, PARAMS)
    path = keyframe_path(0, "a" * 64)
    transport.upload(path, b"k" * 1000)
    assert transport.read(path, 10**6) is None  # not before its publish
    transport.publish(b"update", {"outer_step": 0, "format": 1}, [])
    assert transport.publish_s == pytest.approx(transport.latency.publish_time(1006))
    clock.now = transport.publish_s
    assert transport.read(path, 10**6) == b"k" * 1000
    assert transport.read_step_count()["outer_step"] == 0


# ---------------------------------------------------------------- issue 47: an honest simulator


def test_arm_names_pick_h_jitter_the_master_apart_and_a_rung_or_a_batch():
    arm = sim.parse_arm("d_f0.25_eager_keep_muon_bw_int2_gint8_h10_jit0.3_mx_s2400")
    assert (arm.inner_steps, arm.jitter, arm.master_apart, arm.steps) == (10, 0.3, True, 2400)
    rung = sim.parse_arm("a_muon_s1200_b32")
    assert (rung.fleet, rung.steps, rung.batch, rung.inner) == ("single", 1200, 32, "muon")
    plain = sim.parse_arm("c_f0.25_sync_keep")  # s-prefixed flags are no horizon
    assert (plain.steps, plain.sync, plain.master_apart, plain.jitter) == (None, True, False, 0.0)
    with pytest.raises(ValueError, match="a takes only"):
        sim.parse_arm("a_h10")
    with pytest.raises(ValueError, match="b32"):
        sim.parse_arm("c_f0.25_b32")  # a fleet's batch would change its step time


def test_f_is_a_fraction_of_the_loop_that_runs_and_h_leaves_the_link_alone():
    scale = sim.Scale()
    adamw = sim.link_latency(sim.parse_arm("c_f0.25_bw"), scale, PARAMS)
    muon = sim.link_latency(sim.parse_arm("c_f0.25_bw_muon"), scale, PARAMS)
    fixed = sim.FIXED_SHARE * scale.loop_s * sim.MUON_STEP_COST
    assert muon.upload_s == pytest.approx(fixed + 0.25 * scale.loop_s * sim.MUON_STEP_COST)
    assert muon.link.up == pytest.approx(adamw.link.up / sim.MUON_STEP_COST)  # a slower link
    h10 = sim.link_latency(sim.parse_arm("c_f0.25_bw_muon_h10"), scale, PARAMS)
    assert h10.link == muon.link


def test_the_masters_reads_of_deltas_cost_their_bytes(tmp_path):
    from speedtronic.distributed.protocol import delta_path
    from speedtronic.distributed.transport import LocalTransport

    scale = sim.Scale()
    link = sim.link_latency(sim.parse_arm("c_f0.25_bw_int2"), scale, PARAMS)
    assert link.master_read_time(0) == 0.0
    assert link.master_read_time(1000) == pytest.approx(link.link.fixed_s + 1000 / link.link.down)
    plain = sim.Latency(0.25, 15.0, weights_bytes=4000)  # f arms: by a full global's bytes
    assert plain.master_read_time(1000) == pytest.approx(plain.download_s / 4)
    transport = sim.LatentTransport(LocalTransport(tmp_path / "repo"), sim.SimClock())
    transport.upload(delta_path("w1", 1), b"d" * 300)
    transport.land(everything=True)
    assert transport.read(delta_path("w1", 1), 10**6) == b"d" * 300
    assert transport.read("step_count.json", 10**6) is None  # not a delta: not counted
    assert transport.delta_bytes_read == 300


def make_simulation(tmp_path, master_node):
    from speedtronic.distributed.transport import LocalTransport

    clock = sim.SimClock()
    transport = sim.LatentTransport(LocalTransport(tmp_path / "repo"), clock)
    latency = sim.Latency(0.25, 15.0, weights_bytes=4000)
    simulation = sim.Simulation([], None, transport, clock, latency, False, None, lambda t: None)
    simulation.master_node = master_node
    return simulation, clock, transport


@pytest.mark.parametrize("master_node", [0, None])
def test_a_training_master_publishes_behind_its_workers_upload(tmp_path, master_node):
    simulation, clock, transport = make_simulation(tmp_path, master_node)
    clock.now, simulation.uplink_free_at = 1.0, 5.0  # worker 0's delta is going up till 5
    transport.delta_bytes_read = 2000  # this poll read half a global's bytes of deltas
    read_s = simulation.latency.download_s / 2
    delay = simulation._publish_delay(2.0)
    if master_node is None:  # a machine of its own: after its reads only
        assert delay == pytest.approx(read_s + 2.0)
    else:  # the shared uplink: after the upload, and the next upload waits for it
        assert delay == pytest.approx(4.0 + 2.0)
        assert simulation.uplink_free_at == pytest.approx(7.0)


def test_jitter_draws_a_steps_time_around_its_mean():
    import random
    import statistics

    steady = sim.SimNode(None, None, 0.3, 10)
    assert {steady.next_step_s() for _ in range(5)} == {0.3}
    jittery = sim.SimNode(None, None, 0.3, 10, jitter=0.3, rng=random.Random(0))
    draws = [jittery.next_step_s() for _ in range(4000)]
    assert statistics.mean(draws) == pytest.approx(0.3, rel=0.03)
    assert statistics.pstdev(draws) == pytest.approx(0.3 * 0.3, rel=0.15)


# ---------------------------------------------------- issue 54: the round without a publish


def test_gdeltas_names_the_mode_and_keeps_the_keyframe_cadence():
    arm = sim.parse_arm("c_f0.25_eager_keep_muon_bw_int2_gdeltas_h10_lr1.5_kf5")
    assert (arm.global_dtype, arm.keyframe_every, arm.inner_steps) == ("deltas", 5, 10)


def test_gdeltas_publishes_a_record_and_the_weights_only_as_a_keyframe(tmp_path):
    from speedtronic.distributed.transport import LocalTransport

    transport = sim.LatentTransport(LocalTransport(tmp_path / "repo"), sim.SimClock())
    scale = sim.Scale()
    transport.latency = sim.link_latency(sim.parse_arm("c_f0.25_bw_int2_gdeltas"), scale, PARAMS)
    transport.keyframe_every = 10
    weights = b"w" * 4000  # the exact fp32 weights the product hands its publish
    sent = []
    for step in (9, 10, 11):
        transport.publish(weights, {"outer_step": step, "format": 1}, [])
        sent.append(transport.publish_s)
    record = transport.latency.publish_time(sim.RECORD_BYTES)
    keyframe = transport.latency.publish_time(sim.RECORD_BYTES + 4000)
    assert sent == pytest.approx([record, keyframe, record])
    transport.final = True  # the run's last round is a keyframe whatever its step
    transport.publish(weights, {"outer_step": 12, "format": 1}, [])
    assert transport.publish_s == pytest.approx(keyframe)
    assert transport.bytes_published == 4 * sim.RECORD_BYTES + 2 * 4000


def test_gdeltas_a_node_downloads_the_other_nodes_deltas_of_each_round_it_lacks(tmp_path):
    simulation, _, _ = make_simulation(tmp_path, 0)
    simulation.replay_bytes = 100
    simulation.rounds = {1: ["w0", "w1", "w2", "w3"], 2: ["w1", "w2"], 3: ["w0"]}
    assert simulation.replay_bytes_for("w0", 0, 1) == 300  # not its own
    assert simulation.replay_bytes_for("w0", 0, 3) == 500  # rounds 1-3 replayed
    assert simulation.replay_bytes_for("w1", 1, 3) == 200
    assert simulation.replay_bytes_for("w0", 2, 3) == 0  # only its own delta: nothing to fetch
    simulation._record(SimpleNamespace(outer_step=4, included=["w2/7/ab", "w3/5/cd"]))
    assert simulation.rounds[4] == ["w2", "w3"]


@pytest.mark.slow  # three small fleets: ~15 s alone, a minute on a loaded machine
def test_a_gdeltas_fleet_downloads_whole_deltas_and_its_master_sends_less(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def f(x):\n    return x + 1\n" * 400)
    scale = sim.Scale(steps=8, inner_steps=2, warmup=2, eval_every=2, eval_batch=4,
                      eval_batches=1, **sim.DRY)  # fmt: skip
    results = {}
    for mode in ("gint8", "gdeltas"):
        arm = sim.parse_arm(f"c_f0.25_eager_keep_bw_int2_{mode}")
        results[mode] = sim.Job(arm, 0, scale, str(corpus), tmp_path / mode).run()
    deltas, int8 = results["gdeltas"], results["gint8"]
    assert deltas["status"] == "completed" and deltas["global_dtype"] == "deltas"
    job = sim.Job(sim.parse_arm("c_f0.25_bw_int2"), 0, scale, str(corpus), tmp_path / "p")
    params = sim.parameters_of(job._runtime(0, 1, "p").model)
    one = sim.expected_delta_bytes(params, "int2")  # one delta's bytes, as the link charges
    down = deltas["bytes_down_per_round"] * deltas["workers"] * deltas["rounds"]
    assert 0 < down and round(down) % one == 0  # whole deltas, never weights
    assert deltas["bytes_down_per_round"] <= 3 * one * 1.0001  # at most the 3 others a round
    assert deltas["master_bytes_up_per_round"] < int8["master_bytes_up_per_round"]


# ---------------------------------------------------- issue 54 item 6: machines that misbehave


def test_arm_names_pick_stalls_and_a_jittery_link():
    arm = sim.parse_arm("d_f0.25_muon_bw_int2_jit0.3_stall0.1_ljit0.5")
    assert (arm.jitter, arm.stall, arm.link_jitter) == (0.3, 0.1, 0.5)
    with pytest.raises(ValueError, match="stall1"):
        sim.parse_arm("d_f0.25_stall1")  # a chance, below 1


def test_a_stall_pauses_one_inner_loop_and_only_right_after_a_boundary():
    import random

    config = SimpleNamespace(inner_steps=10)
    trainer, plugin = SimpleNamespace(step=20), SimpleNamespace(boundary_step=20, config=config)
    runtime = SimpleNamespace(trainer=trainer)
    node = sim.SimNode(runtime, plugin, 0.5, 100, stall=0.25, stall_rng=random.Random(0))
    pauses = [node.pause_s() for _ in range(2000)]
    assert set(pauses) == {0.0, 5.0} and node.stalls == pauses.count(5.0)  # a loop: 10 x 0.5 s
    assert pauses.count(5.0) / len(pauses) == pytest.approx(0.25, abs=0.04)
    trainer.step = 21  # mid-loop: never
    assert {node.pause_s() for _ in range(200)} == {0.0}


def test_a_jittery_link_draws_each_transfer_around_its_time(tmp_path):
    import random
    import statistics

    simulation, _, _ = make_simulation(tmp_path, 0)
    assert simulation._link_s(2.0) == 2.0  # no jitter: the link's time
    simulation.link_jitter, simulation.link_rng = 0.5, random.Random(1)
    draws = [simulation._link_s(2.0) for _ in range(4000)]
    assert statistics.mean(draws) == pytest.approx(2.0, rel=0.05) and min(draws) < 1.0

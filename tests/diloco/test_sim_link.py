"""The convergence simulator's ``bw`` arms (issue 38): transfers cost bytes over a link, so a
smaller encoding uploads sooner, and the global's download and publish are charged too."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

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

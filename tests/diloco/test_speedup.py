"""The speedup of benchmarks/diloco/speedup.py (issue 47): one machine's time to a loss, read on
a ladder of annealed runs, over the fleet's time with its flush; bounds outside the ladder."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "diloco"))
import speedup  # noqa: E402

RUNGS = [(90.0, 2.0), (180.0, 1.8), (360.0, 1.6), (720.0, 1.5)]


def test_time_to_a_loss_is_read_between_rungs_linear_in_log_time():
    t, relation = speedup.time_to_reach(RUNGS, 1.7)
    assert relation == "="
    assert t == pytest.approx(math.sqrt(180.0 * 360.0))  # halfway in loss: halfway in log time
    assert speedup.time_to_reach(RUNGS, 1.6) == (pytest.approx(360.0), "=")


def test_outside_the_ladder_the_time_is_a_bound_never_extrapolated():
    assert speedup.time_to_reach(RUNGS, 2.5) == (90.0, "<=")
    assert speedup.time_to_reach(RUNGS, 1.2) == (720.0, ">")
    assert speedup.time_to_reach([], 1.0) is None


def test_a_rung_no_better_than_a_shorter_one_is_left_out():
    bumpy = [(90.0, 2.0), (180.0, 1.8), (360.0, 1.85), (720.0, 1.6)]
    t, _ = speedup.time_to_reach(bumpy, 1.7)
    assert t == pytest.approx(math.sqrt(180.0 * 720.0))


def result(arm, seed, until_s, test, dev=None, flushed_s=None):
    dev = test if dev is None else dev
    return {"arm": arm, "seed": seed, "until_s": until_s, "flushed_s": flushed_s,
            "final_test_loss": test, "final_eval_loss": dev}  # fmt: skip


def test_an_arm_is_read_against_its_own_seed_and_inner_optimizer_with_its_flush():
    results = [result(f"a_muon_s{t // 0.3:.0f}", 0, t, loss) for t, loss in RUNGS]
    results += [result(f"a_s{t // 0.3:.0f}", 0, t, loss - 1.0) for t, loss in RUNGS]  # AdamW
    results.append(result("c_f0.25_muon_bw", 0, 180.0, 1.6, flushed_s=200.0))
    results.append(result("a_muon_b32", 0, 180.0, 1.5))  # data parallel: no flush
    rows = {row["arm"]: row for row in speedup.speedup_rows(results)}
    assert set(rows) == {"c_f0.25_muon_bw", "a_muon_b32"}
    assert rows["c_f0.25_muon_bw"]["test"] == [{"x": pytest.approx(360 / 200), "relation": "="}]
    assert rows["c_f0.25_muon_bw"]["test_mean"] == pytest.approx(1.8)
    assert rows["a_muon_b32"]["test"] == [{"x": pytest.approx(4.0), "relation": "="}]
    assert rows["c_f0.25_muon_bw"]["fastest"] == 1.0


def test_an_uneven_fleet_is_also_read_against_its_own_fastest_machine(capsys):
    results = [result(f"a_muon_s{t // 0.3:.0f}", 0, t, loss) for t, loss in RUNGS]
    uneven = result("d_f0.25_muon_bw", 0, 180.0, 1.6, flushed_s=200.0)
    results.append({**uneven, "speeds": [0.4, 0.5, 1.0, 2.0]})
    [row] = speedup.print_speedups(results)
    assert row["fastest"] == 2.0
    assert "vs its fastest machine: 0.90" in capsys.readouterr().out  # 1.8 / 2.0


def test_fleet_vs_sync_reads_ddps_and_the_fleets_speedup_in_steps_on_its_one_rungs():
    import fleet_vs_sync

    scale = fleet_vs_sync.Scale(steps=500)
    finals = {"one": {"loss": 2.0}, "one_x2": {"loss": 1.8}, "one_long": {"loss": 1.6},
              "ddp": {"loss": 1.6}, "fleet": {"loss": 1.9}}  # fmt: skip
    found = fleet_vs_sync.speedups(finals, scale)
    assert found["ddp"] == {"x": 4.0, "relation": "="}
    assert found["fleet"] == {"x": pytest.approx(math.sqrt(2), abs=1e-3), "relation": "="}
    assert fleet_vs_sync.speedups({"one": {"loss": 2.0}, "fleet": {"loss": 1.9}}, scale) == {}


def test_results_name_the_cpu_and_the_onednn_isa_that_made_their_losses(monkeypatch):
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import convergence

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")  # pinned below bf16 and AMX
    host = convergence.host_cpu()
    assert host["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert host["onednn_max_cpu_isa"] == "AVX512_CORE"
    if host["onednn_isa"] is not None:  # oneDNN ran the bf16 matmul: the pin held
        assert "AVX-512" in host["onednn_isa"] and "bfloat16" not in host["onednn_isa"]
        assert "amx" not in host["onednn_bf16_matmul"]

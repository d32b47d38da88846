"""``benchmarks/optim/time_to_quality.py`` reads what it claims (issue 30): an arm's name is its
recipe, a lane reaches the target at its first evaluation at or below it (live or read back
from its curve), and a candidate's ratios are over the baseline lane of its own seed."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks" / "optim"))
    spec = importlib.util.spec_from_file_location(
        name, ROOT / "benchmarks" / "optim" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ttq = load("time_to_quality")
lanes = load("ttq_lanes")
TUNED = {"adamw_lr": 2e-3, "muon_adamw_lr": 3e-3, "muon_lr": 0.02}


def test_an_arm_name_is_its_recipe():
    arm = lanes.parse_arm("muon_mlr0.03_mw100_wsd_qk_z@450", TUNED, 600)
    assert (arm.optimizer, arm.lr, arm.muon_lr, arm.momentum_warmup) == ("muon", 3e-3, 0.03, 100)
    assert arm.wsd and arm.qk_norm and arm.zero_init and arm.horizon == 450
    base = lanes.parse_arm("adamw#aa", TUNED, 600)
    assert (base.optimizer, base.lr, base.horizon, base.muon_lr) == ("adamw", 2e-3, 600, None)
    config = lanes.lane_config(arm, "small", 1, "corpus.txt", "out", "cpu")
    assert config["optimizer"]["muon_momentum_warmup_steps"] == 100
    assert config["scheduler"]["name"] == "wsd" and config["model"]["qk_norm"] is True
    with pytest.raises(ValueError, match="unknown modifier 'fast'"):
        lanes.parse_arm("muon_fast", TUNED, 600)


def record(arm, seed, curve, horizon=600):
    return {"arm": arm, "seed": seed, "size": "small", "horizon": horizon, "curve": curve,
            "reached_step": None, "reached_s": None, "reached_cpu_s": None, "status": "missed",
            "optimizer_share": 0.05, "step_ms": 10.0, "last_eval_loss": curve[-1][2],
            "load_before": [1.0, 1.0, 1.0]}  # fmt: skip


def test_a_lane_reaches_the_target_at_its_first_evaluation_at_or_below_it():
    curve = [[0, 0.0, 5.0, 0.0], [10, 1.0, 1.4, 0.9], [20, 2.0, 1.3, 1.8], [30, 3.0, 1.2, 2.7]]
    hit = ttq.retarget(record("muon", 0, curve), 1.3)
    assert (hit["reached_step"], hit["reached_s"], hit["reached_cpu_s"]) == (20, 2.0, 1.8)
    assert hit["status"] == "reached"
    miss = ttq.retarget(record("muon", 0, curve), 1.1)
    assert miss["reached_step"] is None and miss["status"] == "missed"


def test_ratios_are_over_the_baseline_of_the_same_seed_and_a_gain_needs_both_seeds():
    base = [[0, 0.0, 5.0, 0.0], [600, 60.0, 1.3, 50.0]]
    fast = [[0, 0.0, 5.0, 0.0], [300, 33.0, 1.3, 25.0]]
    last = lambda step, s, loss: [[0, 0.0, 5.0, 0.0], [step, s, loss, s]]  # noqa: E731
    records = [
        record("adamw", 0, base), record("adamw", 1, last(600, 40.0, 1.3)),
        record("muon", 0, fast), record("muon", 1, last(450, 30.0, 1.29)),
        record("muon_z", 0, fast), record("muon_z", 1, last(450, 30.0, 1.4)),
    ]  # fmt: skip
    rows = {r["arm"]: r for r in ttq.summarize([ttq.retarget(r, 1.3) for r in records])}
    muon = rows["muon"]
    assert muon["time_ratio"] == pytest.approx([33 / 60, 30 / 40])
    assert muon["steps_ratio"] == pytest.approx([0.5, 0.75])
    assert muon["cpu_ratio"] == pytest.approx([25 / 50, 30 / 40])
    assert muon["gain"] == pytest.approx(0.75)  # the worse seed
    assert rows["muon_z"]["gain"] is None and not rows["muon_z"]["all_seeds_reached"]


def test_the_large_baseline_is_the_best_of_its_seed_0_grid_and_its_final_the_target():
    """The large race is against a tuned AdamW: its frozen lr is the grid's best final eval
    loss on seed 0, not at the grid's edge, and the target is that final (rounded up, so that
    the baseline reaches it); the candidate's own AdamW half stays as it was frozen."""
    saved = ROOT / "benchmarks" / "results" / "time_to_quality_large_tune.json"
    grid = json.loads(saved.read_text())["results"]
    frozen = ttq.FROZEN["large"]
    finals = {
        lanes.parse_arm(r["arm"], frozen, 150).lr: r["last_eval_loss"]
        for r in grid
        if r["seed"] == 0 and r["steps"] == ttq.HORIZON["large"]
    }
    assert len(finals) >= 4
    best = min(finals, key=finals.get)
    assert frozen["adamw_lr"] == best and min(finals) < best < max(finals)
    assert finals[best] <= frozen["target"] < finals[best] + 1e-4
    assert lanes.parse_arm("muon@120", frozen, 150).lr == 2e-3

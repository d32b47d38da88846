"""``optimizer.name: muon`` in whole runs (issue 30): the smoke config trains, a run resumes bit
for bit, accumulation and AMP hold, DDP ranks take the same update, DumbDiLoCo's inner loop
keeps or resets Muon's momentum as configured, and the run's facts name the split."""

from __future__ import annotations

import copy

import pytest
import torch
from checkpoint.test_resume import final_weights, run, straight_and_split

from speedtronic.config import SpeedtronicConfig
from speedtronic.runtime import build_runtime, train_from_config


@pytest.fixture
def muon(tiny):
    tiny["optimizer"] = {"name": "muon", "lr": 1e-2, "muon_lr": 0.02}
    return tiny


def test_muon_trains_the_smoke_config(tmp_path):
    raw = SpeedtronicConfig.default().to_dict(redact=False)
    raw["optimizer"]["name"] = "muon"
    raw["run"].update(max_steps=30, output_dir=str(tmp_path / "smoke"))
    events = []
    result = train_from_config(raw, console=False, hooks=[lambda e, p: events.append((e, p))])
    [start] = [p for e, p in events if e == "run_start"]
    label = start["optimizer"]
    assert label.startswith("muon (14 matrices, ") and "+ adamw (" in label
    losses = [p["loss"] for e, p in events if e == "train_step"]
    assert result.status == "completed" and losses[-1] < 0.6 * losses[0]


def test_muon_resumes_bit_exactly_with_accumulation(muon, tmp_path):
    assert muon["data"]["target_batch_size"] == 2 * muon["data"]["micro_batch_size"]
    straight_and_split(muon, tmp_path)


def test_muon_momentum_warmup_resumes_exactly(muon, tmp_path):
    muon["optimizer"]["muon_momentum_warmup_steps"] = 6
    straight_and_split(muon, tmp_path)


def test_accumulation_gives_the_big_batch_update(muon, tmp_path):
    muon["optimizer"]["muon_precision"] = "fp32"  # bf16 rounding would hide a real difference
    muon["run"]["max_steps"] = 3
    big = copy.deepcopy(muon)
    big["data"] = {"micro_batch_size": 8, "target_batch_size": 8}
    big["run"]["output_dir"] = str(tmp_path / "big")
    accumulated, _ = run(muon)
    whole, _ = run(big)
    a, b = final_weights(accumulated), final_weights(whole)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=key)


def test_bf16_autocast_trains_with_muon(muon):
    muon["precision"] = {"mode": "bf16"}
    muon["run"]["max_steps"] = 2
    result = train_from_config(muon, console=False)
    assert result.status == "completed" and torch.isfinite(torch.tensor(result.final_loss))


def test_validate_facts_name_the_split(muon, tmp_path):
    from speedtronic.cli.train import derived_facts

    facts = derived_facts(SpeedtronicConfig.from_dict(muon))
    split = "muon on 7 matrices (16.4K) from hidden_matrices(); adamw on 4 tensors (2.1K)"
    assert facts["optimizer"] == split
    muon["optimizer"]["muon_exclude"] = ["nothing.*"]
    with pytest.raises(Exception, match="muon_exclude: 'nothing.*' matches no parameter"):
        derived_facts(SpeedtronicConfig.from_dict(muon))


# ---- DumbDiLoCo: the inner optimizer is Muon -----------------------------------------------


class Momentum:
    """Records, after every step, whether Muon's momentum buffers are there (after installs)."""

    name = "momentum_spy"

    def __init__(self):
        self.present: list[bool] = []

    def after_optimizer_step(self, trainer):
        state = trainer.optimizer.state
        muon = trainer.optimizer.split.muon
        self.present.append(all("momentum_buffer" in state[p] for p in muon))


@pytest.mark.parametrize("reset", [False, True])
def test_diloco_inner_loop_with_muon_keeps_or_resets_its_momentum(muon, tmp_path, reset):
    muon["run"]["max_steps"] = 6
    muon["distributed"] = {
        "enabled": True,
        "role": "master",
        "node_id": "node-a",
        "repo_id": str(tmp_path / "repo"),
        "inner_steps": 2,
        "install": "boundary",
        "sync_wait_s": 10,  # each boundary installs the round holding this node's delta
        "min_deltas": 1,
        "max_wait_s": 0,
        "poll_interval": 0.02,
        "min_publish_interval_s": 0,
        "delta_dtype": "fp32",
        "outer_lr": 0.5,
        "reset_inner_optimizer": reset,
        "drain_timeout_s": 0,  # a lone master: no fleet to wait for at the end (I6)
    }
    spy, events = Momentum(), []
    runtime = build_runtime(muon, console=False, hooks=[lambda e, p: events.append((e, p))])
    runtime.trainer.plugins.append(spy)  # after the DiLoCo plug-ins: it sees their installs
    try:
        result = runtime.trainer.fit()
    finally:
        runtime.logger.close()
    installed = [p["installed"] for e, p in events if e == "diloco_boundary"]
    assert result.status == "completed" and installed[:2] == [1, 2]
    # at a boundary (steps 2, 4, 6) the install keeps the momentum or clears it
    assert spy.present == [True, not reset, True, not reset, True, not reset]


@pytest.mark.slow
def test_muon_compiled_trains_like_eager(muon, tmp_path):
    muon["optimizer"]["muon_precision"] = "fp32"
    muon["run"]["max_steps"] = 3
    eager, _ = run(muon)
    muon["compile"] = True
    muon["run"]["output_dir"] = str(tmp_path / "compiled")
    warnings = []
    compiled = train_from_config(
        muon, console=False, hooks=[lambda e, p: e == "warning" and warnings.append(p)]
    )
    assert not warnings and compiled.steps == 3
    assert compiled.final_loss == pytest.approx(eager.final_loss, rel=1e-3)


@pytest.mark.slow
def test_two_ddp_ranks_take_muons_single_process_update(muon, tmp_path):
    from ddp_support import run_ranks
    from train.test_ddp import assert_close_weights, weights

    muon["optimizer"]["muon_precision"] = "fp32"
    muon["data"] = {"micro_batch_size": 2, "target_batch_size": 8}
    muon["run"]["max_steps"] = 4
    single = train_from_config(muon, console=False)
    config = copy.deepcopy(muon)
    config["run"]["output_dir"] = str(tmp_path / "ddp")
    rank0, rank1 = run_ranks(config, 2, tmp_path / "reports")
    assert rank0["checksum"] == rank1["checksum"]  # every rank the same update, exactly
    assert_close_weights(weights(single.checkpoint), weights(rank0["checkpoint"]))


def test_build_runtime_reports_the_muon_kernel_and_a_scheduler_over_both(muon):
    runtime = build_runtime(muon, console=False)
    lrs = [g["lr"] for g in runtime.optimizer.param_groups]
    assert lrs == pytest.approx([1e-2 / 2, 1e-2 / 2, 0.02 / 2])  # warmup step 1 of 2

"""``optimizer.name: muon`` from the outside (issue 30): a bad Muon key on the command line or
in a YAML file is one line naming the key and the value (exit 2, no traceback), and a tiny
DumbDiLoCo fleet (a master and two ``speedtronic train`` workers) trains with Muon inside."""

from __future__ import annotations

import pytest
import torch
import yaml
from cli.test_errors import assert_one_line_usage_error, run_main
from diloco import test_e2e as e2e


@pytest.mark.parametrize(
    ("setting", "needles"),
    [
        ("optimizer.muon_momentum=1.5", ("optimizer.muon_momentum", "1.5")),
        ("optimizer.muon_ns_steps=0", ("optimizer.muon_ns_steps", "0")),
        ("optimizer.muon_precision=fp8", ("optimizer.muon_precision", "fp8")),
        ("optimizer.muon_lr_adjust=rms", ("optimizer.muon_lr_adjust", "rms")),
        ("optimizer.muon_exclude=[nothing.*]", ("optimizer.muon_exclude", "nothing.*")),
    ],
)
def test_a_bad_muon_key_is_one_line_naming_key_and_value(setting, needles, capsys, monkeypatch):
    args = ["validate", "--set", "optimizer.name=muon", "--set", setting]
    code, _, err = run_main(args, capsys, monkeypatch)
    assert_one_line_usage_error(code, err, *needles)


def test_a_muon_key_without_muon_in_a_yaml_file_says_so(tmp_path, capsys, monkeypatch):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"optimizer": {"muon_lr": 0.02}}))
    code, _, err = run_main(["validate", "-c", str(path)], capsys, monkeypatch)
    assert_one_line_usage_error(code, err, "optimizer.muon_lr", "0.02", "optimizer.name: muon")


@pytest.mark.slow
def test_a_master_and_two_muon_workers_train_one_model(tmp_path, monkeypatch):
    optimizer = {"name": "muon", "lr": 1e-2, "muon_lr": 0.02, "muon_precision": "fp32"}
    monkeypatch.setitem(e2e.CONFIG, "optimizer", optimizer)
    e2e.test_a_master_and_two_workers_train_one_model_through_a_directory(tmp_path)
    for name in ("worker-1", "worker-2"):  # they trained with Muon, not the default
        [last] = sorted((tmp_path / name / "checkpoints").glob("step_*/trainer_state.pt"))
        state = torch.load(last, weights_only=True)["optimizer"]["state"]
        kinds = {key for entry in state.values() for key in entry}
        assert {"momentum_buffer", "exp_avg"} <= kinds, (name, kinds)  # Muon's and AdamW's

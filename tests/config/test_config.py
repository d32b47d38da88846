"""SpeedtronicConfig: loading, strict types, helpful errors, overrides, redaction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speedtronic.config import SpeedtronicConfig, default_config_text
from speedtronic.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def problems_of(raw, overrides=None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        SpeedtronicConfig.from_dict(raw, overrides)
    return info.value.problems


def test_defaults_and_embedded_smoke_config_load():
    config = SpeedtronicConfig.default()
    assert config.run.name == "smoke"
    assert config.model.name == "reference_transformer"
    assert config.model.params["n_kv_head"] == 2
    assert SpeedtronicConfig.from_dict({}).optimizer.lr == 3e-4


def test_shipped_smoke_config_matches_the_embedded_one():
    assert (ROOT / "configs" / "smoke.yaml").read_text() == default_config_text()


def test_one_loader_for_dict_yaml_json_and_paths(tmp_path):
    raw = {"run": {"max_steps": 7}, "optimizer": {"lr": 0.01}}
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("run:\n  max_steps: 7\noptimizer:\n  lr: 0.01\n")
    json_file = tmp_path / "c.json"
    json_file.write_text(json.dumps(raw))
    for source in (raw, yaml_file, str(yaml_file), json_file, json.dumps(raw)):
        config = SpeedtronicConfig.load(source)
        assert (config.run.max_steps, config.optimizer.lr) == (7, 0.01)


def test_scientific_notation_without_dot_is_a_float():
    config = SpeedtronicConfig.from_yaml("optimizer:\n  lr: 1e-3\n  eps: 1E-8\n")
    assert config.optimizer.lr == pytest.approx(1e-3)
    assert isinstance(config.optimizer.eps, float)


def test_top_level_aliases_mean_run_keys():
    config = SpeedtronicConfig.from_dict({"name": "x", "max_steps": 3, "seed": 5, "device": "cpu"})
    assert (config.run.name, config.run.max_steps, config.run.seed) == ("x", 3, 5)
    assert "both at top level" in problems_of({"max_steps": 3, "run": {"max_steps": 4}})[0]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"optimzer": {}}, "optimzer: unknown key; did you mean 'optimizer'?"),
        (
            {"scheduler": {"warmup_step": 1}},
            "scheduler.warmup_step: unknown key; did you mean 'warmup_steps'?",
        ),
        (
            {"data": {"shuffle": "false"}},
            "data.shuffle: must be true or false (got the string 'false')",
        ),
        ({"compile": 1}, "compile: must be true or false (got 1)"),
        ({"run": {"max_steps": 2.5}}, "run.max_steps: must be an integer (got 2.5)"),
        ({"run": {"max_steps": True}}, "run.max_steps: must be an integer (got True)"),
        ({"optimizer": {"lr": "fast"}}, "optimizer.lr: must be a number (got the string 'fast')"),
        ({"optimizer": {"lr": -0.1}}, "optimizer.lr: must be > 0 (got -0.1)"),
        (
            {"precision": {"mode": "fp8"}},
            "precision.mode: must be one of 'auto', 'bf16', 'fp16', 'fp32' (got the string 'fp8')",
        ),
        ({"optimizer": {"betas": [0.9]}}, "optimizer.betas: must be a list of 2 numbers"),
        ({"run": {"device": "tpu"}}, "run.device: must be auto, cpu, cuda, cuda:N or mps"),
        ({"distributed": {"node_id": "../etc"}}, "distributed.node_id: must be 1-64 characters"),
    ],
)
def test_bad_values_name_the_key_and_the_rule(raw, expected):
    assert problems_of(raw)[0].startswith(expected)


def test_accumulation_must_divide_evenly():
    problem = problems_of({"data": {"micro_batch_size": 3, "target_batch_size": 8}})[0]
    assert problem.startswith("data.target_batch_size: must be a multiple of data.micro_batch_size")
    config = SpeedtronicConfig.from_dict({"data": {"micro_batch_size": 4, "target_batch_size": 12}})
    assert config.accumulation_steps == 3


def test_every_problem_is_reported_at_once():
    problems = problems_of({"optimizer": {"lr": "x", "eps": "y"}, "bogus": 1})
    assert len(problems) == 3


def test_int_widens_to_float_but_not_the_other_way():
    assert SpeedtronicConfig.from_dict({"optimizer": {"lr": 1}}).optimizer.lr == 1.0


def test_derived_facts():
    config = SpeedtronicConfig.from_dict(
        {
            "model": {"seq_len": 32},
            "data": {"micro_batch_size": 2, "target_batch_size": 8},
            "run": {"name": "abc", "max_steps": 50},
        }
    )
    assert config.tokens_per_step == 8 * 32
    assert config.schedule_steps == 50
    assert config.output_dir == Path("runs/abc")
    assert config.checkpoint_dir == Path("runs/abc/checkpoints")


def test_overrides_set_any_key_without_editing_the_file():
    config = SpeedtronicConfig.from_dict(
        {"run": {"max_steps": 10}},
        ["optimizer.lr=1e-3", "max_steps=20", "data.shuffle=false", "model.n_layer=3"],
    )
    assert config.optimizer.lr == pytest.approx(1e-3)
    assert config.run.max_steps == 20
    assert config.data.shuffle is False
    assert config.model.params["n_layer"] == 3
    assert "unknown key" in problems_of({}, ["optimizer.lrr=1"])[0]
    with pytest.raises(ConfigError, match="expected key.path=value"):
        SpeedtronicConfig.from_dict({}, ["optimizer.lr"])


def test_token_is_redacted_whenever_written_or_printed():
    config = SpeedtronicConfig.from_dict({"distributed": {"token": "hf_secret123"}})
    assert config.distributed.token == "hf_secret123"
    for text in (config.to_yaml(), json.dumps(config.to_dict()), repr(config)):
        assert "hf_secret123" not in text
    assert "<redacted>" in config.to_yaml()
    assert config.to_dict(redact=False)["distributed"]["token"] == "hf_secret123"


def test_round_trip_through_to_dict():
    config = SpeedtronicConfig.default()
    again = SpeedtronicConfig.from_dict(config.to_dict())
    assert again == config


def test_malformed_yaml_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("run:\n  max_steps: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: malformed YAML at line \d+"):
        SpeedtronicConfig.from_file(path)


def test_missing_file():
    with pytest.raises(ConfigError, match="config file not found: nope.yaml"):
        SpeedtronicConfig.from_file("nope.yaml")


def test_config_module_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, speedtronic.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

"""Issue 31, item 5: ``validate`` says what matters on this machine, one line each, at once.

It said nothing about the data source or whether its files exist, bf16 being emulated on
this CPU, ``num_workers`` above the core count or a vocabulary far above what the data uses,
and it took 6-38 s (most of it building the model). No test here depends on this CPU's
features: the probe and the core count are injected.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from speedtronic.cli.app import app

runner = CliRunner()
GPT2 = str(Path(__file__).resolve().parents[2] / "configs" / "gpt2_small.yaml")


def validate(*args: str):
    return runner.invoke(app, ["validate", *args])


def facts(result) -> dict[str, str]:
    return dict(
        line[2:].split(": ", 1) for line in result.stdout.splitlines() if line.startswith("# ")
    )


def test_validate_names_the_data_source_and_its_files(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"x" * 3000)
    result = validate("--set", f"data.text_path={corpus}", "--set", "data.eval_fraction=0.1")
    assert result.exit_code == 0, result.output
    assert (
        facts(result)["data"] == f"text {corpus} (2.9 KB, byte tokens); eval: the file's last 10%"
    )
    assert facts(validate())["data"].startswith("synthetic (learnable token sequences, no file")


def test_validate_refuses_a_data_file_that_is_not_there(tmp_path):
    result = validate("--set", f"data.text_path={tmp_path / 'nope.txt'}")
    assert result.exit_code == 2
    assert f"speedtronic: error: data.text_path: file not found: {tmp_path / 'nope.txt'}" in (
        result.stderr
    )


def test_validate_says_bf16_is_emulated_on_this_cpu(monkeypatch):
    import speedtronic.train.emulation as emulation

    found = emulation.Verdict("bf16", True, "timing", 79.0, 128)
    monkeypatch.setattr(emulation, "verdict", lambda mode: found)
    result = validate("--set", "precision.mode=bf16", "--set", "run.device=cpu")
    assert result.exit_code == 0
    assert facts(result)["precision"] == "bf16"
    assert (
        "speedtronic: warning: precision.mode: bf16 is emulated on this CPU: its matmuls run "
        in (result.stderr)
    )
    assert "79x slower than fp32" in result.stderr


def test_validate_runs_no_probe_for_fp32(monkeypatch):
    import speedtronic.train.emulation as emulation
    import speedtronic.train.precision as precision

    def refuse(*args):
        raise AssertionError("the emulation probe ran for an fp32 config")

    monkeypatch.setattr(precision, "matmul_slowdown", refuse)
    monkeypatch.setattr(emulation, "verdict", refuse)
    result = validate("--set", "run.device=cpu")
    assert result.exit_code == 0 and facts(result)["precision"] == "fp32"


def test_validate_says_num_workers_is_above_the_core_count(monkeypatch):
    import speedtronic.train.preflight as preflight

    monkeypatch.setattr(preflight, "cpu_cores", lambda: 2)
    result = validate("--set", "data.num_workers=4")
    assert result.exit_code == 0
    assert (
        "speedtronic: warning: data.num_workers: 4 workers for 2 CPU cores; using 2"
        in result.stderr
    )
    assert "warning: data.num_workers" not in validate("--set", "data.num_workers=2").stderr


def test_validate_says_the_vocabulary_is_far_above_the_datas(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("text " * 100)
    result = validate("-c", GPT2, "--set", f"data.text_path={corpus}", "--format", "json")
    assert result.exit_code == 0, result.output
    [line] = [w for w in json.loads(result.stdout)["warnings"] if w.startswith("model.vocab_size")]
    assert line.startswith("model.vocab_size: 50,304, but byte tokens of the text use 256 ids")
    assert "set model.vocab_size: 256" in line


def test_validate_counts_the_reference_model_without_building_it(monkeypatch):
    """What made validate slow: a GPT-2 built (on the meta device) to count its parameters."""
    import speedtronic.model as model

    def refuse(self, config):
        raise AssertionError("validate built the model")

    monkeypatch.setattr(model.ReferenceTransformer, "__init__", refuse)
    result = validate("-c", GPT2)
    assert result.exit_code == 0, result.output
    assert facts(result)["parameters"] == "123587328"


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"vocab_size": 50304, "n_layer": 3, "n_head": 12, "d_model": 768, "seq_len": 32},
        {"n_kv_head": 2, "tie_embeddings": False, "mlp_hidden": 100},
        {"n_head": 8, "n_kv_head": 1, "d_model": 256},
        {"qk_norm": True, "zero_init_projections": True},
    ],
)
def test_the_reference_models_counted_parameters_are_the_built_ones(params):
    from speedtronic.model import ReferenceConfig, ReferenceTransformer

    config = ReferenceConfig(**params)
    assert config.parameter_count() == ReferenceTransformer(config).num_parameters()

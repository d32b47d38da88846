"""LoRA through peft (issue 56 item 3): only the adapters train, are saved and resume exactly;
the base is loaded from --init-from and named by its sha256; bad settings are one line."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from modelout_support import assert_one_line_error, config_of, invoke, latest, train

from speedtronic.checkpoint import load_checkpoint
from speedtronic.errors import ConfigError
from speedtronic.runtime import train_from_config


class StopAt:
    """Ends the run early, as a preemption would (its final checkpoint included)."""

    name = "stop_at"

    def __init__(self, step: int):
        self.step = step

    def after_optimizer_step(self, trainer):
        return "stop" if trainer.step == self.step else None


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The run every LoRA run here adapts (read only: trained once for the module)."""
    return train(tmp_path_factory.mktemp("lora-base"), "base")


def lora_config(tmp_path, base, name="lora", lora=None, **sections):
    sections.setdefault("checkpoint", {})["init_from"] = str(base)
    config = config_of(tmp_path, name, **sections)
    config["model"]["lora"] = {"r": 4, **(lora or {})}
    return config


def test_only_the_adapters_train_and_are_saved(tmp_path, base):
    result = train_from_config(lora_config(tmp_path, base), console=False)
    saved = load_checkpoint(result.checkpoint)
    names = set(saved.model_state)
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names), names
    assert "blocks.0.attn.wq.lora_A.weight" in names and len(names) == 14  # 7 layers, A and B
    assert any(saved.model_state[n].abs().sum() > 0 for n in names if "lora_B" in n)  # trained
    record = saved.meta["lora"]
    assert record["r"] == 4 and record["targets"][0] == "attn.wq"
    assert record["base"]["source"] == str(base.resolve())
    from speedtronic.train.lora import base_sha256

    assert record["base"]["sha256"] == base_sha256(load_checkpoint(latest(base)).model_state)
    full = (latest(base) / "model.safetensors").stat().st_size
    assert (result.checkpoint and saved.path / "model.safetensors").stat().st_size < full / 4


def run(config, stop_at=None, resume=False):
    config = {**config, "checkpoint": {**config["checkpoint"], "resume": resume}}
    plugins = [StopAt(stop_at)] if stop_at else []
    return train_from_config(config, console=False, plugins=plugins)


def test_a_lora_run_resumes_exactly(tmp_path, base):
    config = lora_config(tmp_path, base, "straight", run={"max_steps": 6})
    straight = load_checkpoint(run(config).checkpoint).model_state
    config["run"]["output_dir"] = str(tmp_path / "split")
    assert run(config, stop_at=3).steps == 3
    second = run(config, resume=True)
    assert second.steps == 6
    resumed = load_checkpoint(second.checkpoint).model_state
    assert resumed.keys() == straight.keys()
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key


def test_resumed_with_another_r_is_refused(tmp_path, base):
    config = lora_config(tmp_path, base)
    run(config)
    config["model"]["lora"]["r"] = 8
    with pytest.raises(ConfigError) as info:
        run(config, resume=True)
    assert str(info.value).startswith("--resume: model.lora.r: 4 -> 8 cannot change")
    assert "\n" not in str(info.value)


def test_resumed_on_another_base_is_refused(tmp_path, base):
    config = lora_config(tmp_path, base)
    run(config)
    other = train(tmp_path, "other", run={"seed": 1})
    config["checkpoint"]["init_from"] = str(other)
    with pytest.raises(ConfigError, match=r"is not the base this LoRA run trained on"):
        run(config, resume=True)


def test_target_modules_naming_no_module_are_refused(tmp_path, base):
    config = lora_config(tmp_path, base, lora={"target_modules": ["q_proj", "qkv_proj"]})
    with pytest.raises(ConfigError) as info:
        run(config)
    message = str(info.value)
    assert "model.lora.target_modules: 'qkv_proj' names no linear layer" in message
    assert "available: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj" in message
    assert not (tmp_path / "lora").exists()  # refused before anything was written


def test_reference_and_llama_names_select_the_same_layers(tmp_path, base):
    ours = run(lora_config(tmp_path, base, "ours", lora={"target_modules": ["attn.wq", "wv"]}))
    theirs = run(
        lora_config(tmp_path, base, "theirs", lora={"target_modules": ["q_proj", "v_proj"]})
    )
    a, b = (load_checkpoint(r.checkpoint).model_state for r in (ours, theirs))
    assert sorted(a) == sorted(b) and len(a) == 4


def test_lora_without_init_from_is_one_line(tmp_path):
    path = tmp_path / "lora.yaml"
    config = config_of(tmp_path)
    config["model"]["lora"] = {"r": 4}
    path.write_text(yaml.safe_dump(config))
    result = invoke("train", "-c", path)
    assert_one_line_error(result, "model.lora: needs --init-from")


def test_lora_settings_are_checked_at_load(tmp_path):
    config = config_of(tmp_path, checkpoint={"init_from": "x"})
    config["model"]["lora"] = {"r": 0, "alpah": 2}
    with pytest.raises(ConfigError) as info:
        from speedtronic.config import SpeedtronicConfig

        SpeedtronicConfig.from_dict(json.loads(json.dumps(config)))
    assert info.value.problems == [
        "model.lora.alpah: unknown key; did you mean 'alpha'?",
        "model.lora.r: must be in [1, 2**16] (got 0)",
    ]


def test_a_config_naming_only_lora_resumes_from_the_recorded_base(tmp_path, base):
    """The config names no model (the source's is taken) and --resume names no --init-from:
    the run goes on with the model and base its checkpoint recorded."""
    path = tmp_path / "lora.yaml"
    config = {
        "run": {"device": "cpu", "max_steps": 2, "output_dir": str(tmp_path / "lora")},
        "model": {"lora": {"r": 4}},
        "data": {"micro_batch_size": 4},
    }
    path.write_text(yaml.safe_dump(config))
    assert invoke("train", "-c", path, "--init-from", base).exit_code == 0
    result = invoke("train", "-c", path, "--resume", "--max-steps", 4)
    assert result.exit_code == 0, result.stderr
    assert "resumed from" in result.stderr and "model.lora: r 4" in result.stderr
    assert load_checkpoint(latest(tmp_path / "lora")).meta["step"] == 4


def test_validate_counts_the_adapters_and_checks_the_targets(tmp_path, base):
    path = tmp_path / "lora.yaml"
    config = config_of(tmp_path)
    config["model"]["lora"] = {"r": 4, "target_modules": ["q_proj", "mlp.w_down"]}
    path.write_text(yaml.safe_dump(config))
    result = invoke("validate", "-c", path, "--init-from", base)
    assert result.exit_code == 0, result.stderr
    # d_model 32, mlp_hidden 128: 4 x (32 + 32) + 4 x (128 + 32)
    assert "# lora: r 4, alpha 16 on 2 layers (attn.wq, mlp.w_down): 896 trainable" in result.stdout
    bad = invoke("validate", "-c", path, "--init-from", base, "--set", "model.lora.r=0")
    assert_one_line_error(bad, "model.lora.r: must be in [1, 2**16] (got 0)")
    config["model"]["lora"]["target_modules"] = ["wqkv"]
    path.write_text(yaml.safe_dump(config))
    bad = invoke("validate", "-c", path, "--init-from", base)
    assert_one_line_error(bad, "model.lora.target_modules: 'wqkv' names no linear layer")


def test_init_from_a_lora_run_says_to_export_it_merged(tmp_path, base):
    first = run(lora_config(tmp_path, base))
    config = config_of(tmp_path, "next", checkpoint={"init_from": str(tmp_path / "lora")})
    with pytest.raises(ConfigError, match=r"is a LoRA run's checkpoint \(adapters only\); export"):
        train_from_config(config, console=False)
    assert first.checkpoint


def test_the_base_digest_is_the_same_before_and_after_wrapping():
    """A fleet node names its base by ``base_sha256(base_state(model))`` on the wrapped model:
    it must be the digest the run recorded before wrapping, and any changed bit changes it."""
    from speedtronic.config.sections import LoraConfig
    from speedtronic.registry import build_model
    from speedtronic.train import lora

    sizes = {"vocab_size": 64, "n_layer": 1, "d_model": 32, "n_head": 2, "seq_len": 16}
    model = build_model("reference_transformer", sizes, [])
    adapters = lora.adapt(model, LoraConfig(r=2), "here")
    digest = adapters.record["base"]["sha256"]
    assert lora.base_sha256(lora.base_state(model)) == digest
    assert adapters.record["targets"] == ["attn.wq", "attn.wk", "attn.wv", "attn.wo"] + [
        "mlp.w_gate", "mlp.w_up", "mlp.w_down"
    ]  # fmt: skip
    names = {f"blocks.0.{t}.lora_{ab}.weight" for t in adapters.record["targets"] for ab in "AB"}
    assert set(lora.adapter_state(model)) == names
    with torch.no_grad():
        model.blocks[0].attn.wq.base_layer.weight[0, 0] += 1e-6
    assert lora.base_sha256(lora.base_state(model)) != digest

"""A LoRA run out of the project (issue 56 item 3): ``export`` merges its adapters into a model
transformers loads as it is; ``export --adapter`` writes peft's own layout, which
``PeftModel.from_pretrained`` puts on the exported base; both give the run's logits, and
``--verify`` checks each against transformers (+ peft). ``generate`` and ``eval`` read the run."""

from __future__ import annotations

import json

import pytest
import torch
import transformers  # the oracle: a test dependency, never one of training
from modelout_support import assert_one_line_error, invoke, train_text

from speedtronic.modelout.source import open_run, rebuild
from speedtronic.train import lora

peft = pytest.importorskip("peft")
transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
IDS = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A base run and a LoRA run on it (lr high enough that the adapters move the logits)."""
    tmp = tmp_path_factory.mktemp("lora")
    base = train_text(tmp, name="base")
    tuned = train_text(
        tmp, name="lora", model={"lora": {"r": 4, "alpha": 8}},
        checkpoint={"init_from": str(base)}, optimizer={"lr": 3e-2},
    )  # fmt: skip
    return base, tuned


def adapted_logits(run):
    """The project's logits: the run's model with its adapters as it trained (not merged)."""
    found = open_run(run)
    model = rebuild(found.checkpoint, found.config["model"])
    lora.open_adapted(model, found.lora, found.adapters, "test", print)
    with torch.no_grad():
        return model.eval()(IDS)


def hf(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def test_the_adapter_on_the_exported_base_and_the_merged_export_give_the_runs_logits(
    runs, tmp_path
):
    base, tuned = runs
    ours = adapted_logits(tuned)
    with torch.no_grad():
        assert (ours - open_run(base).model(IDS)).abs().max() > 1e-2  # the adapters trained
    assert invoke("export", base, tmp_path / "base").exit_code == 0
    result = invoke("export", tuned, tmp_path / "adapter", "--adapter")
    assert result.exit_code == 0, result.stderr
    assert "PeftModel.from_pretrained" in result.stdout
    names = {p.name for p in (tmp_path / "adapter").iterdir()}
    assert names == {"adapter_config.json", "adapter_model.safetensors", "speedtronic_export.json"}
    from safetensors import safe_open

    with safe_open(tmp_path / "adapter" / "adapter_model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys
    assert len(keys) == 14
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8
    peft_model = peft.PeftModel.from_pretrained(hf(tmp_path / "base"), tmp_path / "adapter")
    with torch.no_grad():
        assert (peft_model.eval()(IDS).logits - ours).abs().max().item() < 1e-4
    assert invoke("export", tuned, tmp_path / "merged").exit_code == 0
    with torch.no_grad():
        assert (hf(tmp_path / "merged")(IDS).logits - ours).abs().max().item() < 1e-4


@pytest.mark.parametrize("flags", [[], ["--adapter"], ["--adapter", "--dtype", "bf16"]])
def test_verify_checks_what_export_wrote(runs, tmp_path, flags):
    _, tuned = runs
    result = invoke("export", tuned, tmp_path / "out", "--verify", *flags)
    assert result.exit_code == 0, result.stderr
    assert "verified with transformers" in result.stdout
    assert ("and peft" in result.stdout) == ("--adapter" in flags)


def test_a_failed_adapter_verify_writes_nothing(runs, tmp_path, monkeypatch):
    _, tuned = runs
    real = lora.load_peft_adapter

    def skewed(model, folder):  # peft's reading of the files, one adapter weight off
        loaded = real(model, folder)
        with torch.no_grad():
            next(p for n, p in loaded.named_parameters() if "lora_B" in n).add_(0.5)
        return loaded

    monkeypatch.setattr(lora, "load_peft_adapter", skewed)
    result = invoke("export", tuned, tmp_path / "out", "--adapter", "--verify")
    assert_one_line_error(result, "--verify: peft's logits", code=1)
    assert not (tmp_path / "out").exists()


def test_adapter_of_a_run_without_lora_is_one_line(runs, tmp_path):
    base, _ = runs
    result = invoke("export", base, tmp_path / "out", "--adapter")
    assert_one_line_error(result, "--adapter:", "is not a LoRA run")


def test_generate_and_eval_read_a_lora_run(runs, tmp_path):
    base, tuned = runs
    result = invoke(
        "generate", tuned, "-p", "It was", "--temperature", 0, "--max-new-tokens", 4,
        "--format", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    tokens = json.loads(result.stdout)["tokens"]
    model = open_run(tuned).model
    ids = list(b"It was")
    for _ in range(4):
        with torch.no_grad():
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert tokens == ids[-4:]
    text = tmp_path / "held_out.txt"
    text.write_text("It was the age of wisdom, it was the age of foolishness.\n" * 4)
    scored = [invoke("eval", run, "--text", text, "--format", "json") for run in (base, tuned)]
    assert all(r.exit_code == 0 for r in scored), scored[1].stderr
    bpb = [json.loads(r.stdout)["texts"][0]["bits_per_byte"] for r in scored]
    assert bpb[1] != bpb[0]  # the adapters are in the model eval scores


def test_a_lora_run_on_a_transformers_directory_names_it_as_the_adapters_base(runs, tmp_path):
    """The common path: LoRA on a transformers model (here the base run's export); the
    adapter's config names that directory, and --verify loads the adapter onto it."""
    base, _ = runs
    assert invoke("export", base, tmp_path / "hf").exit_code == 0
    tuned = train_text(
        tmp_path, name="tuned", model={"lora": {"r": 2, "target_modules": ["q_proj", "v_proj"]}},
        checkpoint={"init_from": str(tmp_path / "hf")}, run={"max_steps": 2},
    )  # fmt: skip
    result = invoke("export", tuned, tmp_path / "adapter", "--adapter", "--verify")
    assert result.exit_code == 0, result.stderr
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((tmp_path / "hf").resolve())
    assert sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    model = peft.PeftModel.from_pretrained(hf(tmp_path / "hf"), tmp_path / "adapter")
    with torch.no_grad():
        assert (model.eval()(IDS).logits - adapted_logits(tuned)).abs().max().item() < 1e-4

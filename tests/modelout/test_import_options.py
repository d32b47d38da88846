"""The reference model's options for pretrained models (issue 37), held to transformers' classes.

Each option is one ReferenceConfig field: a q/k/v bias (Qwen2ForCausalLM), an explicit
``head_dim`` (queries wider than d_model), Llama-3 RoPE scaling. Tiny random models written by
transformers import with ``--verify`` (float32 logits within 1e-5, greedy tokens equal),
export back bit for bit under their own architecture, and the options change the function
(the tests could fail: without the bias, the head width or the scaling the logits differ).
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from modelout_support import assert_same_tensors, invoke, tensors

from speedtronic.model import ReferenceConfig, ReferenceTransformer, rope_tables
from speedtronic.modelout.source import open_run

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

BASE = dict(
    vocab_size=120,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
)
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
OPTIONS = {
    "qwen2-bias": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
    "head-dim": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {"head_dim": 32}),
    "llama3-rope": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        {"rope_scaling": LLAMA3, "rope_theta": 500000.0},
    ),
}


def written_by_transformers(tmp_path, name: str):
    config_cls, model_cls, extra = OPTIONS[name]
    torch.manual_seed(0)
    model = model_cls(config_cls(**BASE, **extra, tie_word_embeddings=name == "head-dim"))
    with torch.no_grad():  # transformers starts biases at zero: make them count
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(0, 0.5)
    folder = tmp_path / name
    model.save_pretrained(folder)
    return folder, model.eval()


@pytest.mark.parametrize("name", list(OPTIONS))
def test_an_option_imports_verified_and_exports_bit_for_bit(name, tmp_path):
    src, theirs = written_by_transformers(tmp_path, name)
    result = invoke("import", src, tmp_path / "run", "--verify", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["verified"]["max_diff"] <= 1e-5
    ours = open_run(tmp_path / "run", tokenizer="byte").model
    ids = torch.randint(0, 120, (2, 128), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():  # every position, past the original context of llama3's
        assert (ours(ids) - theirs(ids).logits).abs().max().item() <= 1e-5
    result = invoke("export", tmp_path / "run", tmp_path / "exp", "--tokenizer", "byte")
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(tensors(src), tensors(tmp_path / "exp"))
    exported = json.loads((tmp_path / "exp" / "config.json").read_text())
    assert exported["architectures"] == [type(theirs).__name__]
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exp").eval()
    with torch.inference_mode():
        assert torch.equal(again(ids).logits, theirs(ids).logits)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_without_the_option_the_function_differs(name, tmp_path):
    """The option is what makes them equal: the same weights without it compute otherwise."""
    src, theirs = written_by_transformers(tmp_path, name)
    assert invoke("import", src, tmp_path / "run").exit_code == 0
    ours = open_run(tmp_path / "run", tokenizer="byte").model
    ids = torch.randint(0, 120, (1, 128), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        if name == "qwen2-bias":
            for block in ours.blocks:
                block.attn.wq.bias.zero_()
        elif name == "llama3-rope":
            cos, sin = rope_tables(128, 16, 500000.0)
            ours.rope_cos.copy_(cos)
            ours.rope_sin.copy_(sin)
        else:
            for block in ours.blocks:
                block.attn.head_dim = 16  # d_model / n_head: the shapes no longer fit
        try:
            diff = (ours(ids) - theirs(ids).logits).abs().max().item()
        except RuntimeError:
            diff = float("inf")
    assert diff > 1e-3


def test_the_options_are_config_fields_checked_like_the_rest():
    config = ReferenceConfig(d_model=64, n_head=4, head_dim=32, qkv_bias=True)
    model = ReferenceTransformer(config)
    assert model.blocks[0].attn.wq.weight.shape == (128, 64)
    assert model.blocks[0].attn.wo.weight.shape == (64, 128)
    assert model.num_parameters() == config.parameter_count()
    with pytest.raises(ValueError, match="head_dim: must be even"):
        ReferenceConfig(head_dim=7)
    with pytest.raises(ValueError, match="rope_scaling: low_freq_factor must be <"):
        ReferenceConfig(rope_scaling=(8.0, 4.0, 1.0, 32))
    with pytest.raises(ValueError, match="rope_scaling: must be 4 positive numbers"):
        ReferenceConfig(rope_scaling=(8.0, 1.0, 4.0))

"""The reference transformer as transformers' ``LlamaForCausalLM``: the exact mapping, its limits.

Measured (issue 29, tests/modelout/test_export.py holds it): RoPE pairs (i, i + D/2) as Llama's
``rotate_half`` does, so q/k need no permutation; SwiGLU gate/up/down, GQA grouping, the
1/sqrt(head_dim) scale, the final RMSNorm and the tied head all match, with no biases. Weights
copied by name give equal logits. What a config must state explicitly, because transformers'
defaults differ or moved: ``rope_theta`` at the top level (transformers 5 nests it in
``rope_parameters`` and 4.x reads only the top level), ``rms_norm_eps`` (Llama's default is
1e-6, ours 1e-5), ``tie_word_embeddings``, and the BOS/EOS ids of the run's own tokenizer and
data separator (``modelout.stops``), never Llama's defaults (1 and 2 would stop at an ordinary
token).

The options pretrained models need map too: an untied head, an explicit ``head_dim``, Llama-3
RoPE scaling (``rope_scaling``/``rope_parameters`` with ``rope_type: llama3``), and a q/k/v
bias, written as ``Qwen2ForCausalLM`` (Llama's ``attention_bias`` would add one to the output
projection as well). The name tables are read both ways: ``llama_name`` for export,
``reference_name`` for ``speedtronic import``.

``check_exportable`` refuses, in one line, a model this mapping would get wrong: another
class, a config field it does not map set away from its default (a new model option), or a
tensor it has no name for. It reads the model, never guesses.
"""

from __future__ import annotations

import dataclasses
import re

import torch
from torch import nn

from speedtronic.errors import ConfigError
from speedtronic.model import ReferenceConfig, ReferenceTransformer

# ReferenceConfig fields this mapping carries over (init_std and zero_init_projections only
# shape the initial weights, not the architecture).
MAPPED_FIELDS = frozenset(
    "vocab_size seq_len n_layer n_head n_kv_head d_model mlp_hidden rope_theta norm_eps "
    "init_std zero_init_projections tie_embeddings head_dim qkv_bias rope_scaling".split()
)
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "attn.wq.bias": "self_attn.q_proj.bias",  # qkv_bias (Qwen2ForCausalLM)
    "attn.wk.bias": "self_attn.k_proj.bias",
    "attn.wv.bias": "self_attn.v_proj.bias",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.w_gate.weight": "mlp.gate_proj.weight",
    "mlp.w_up.weight": "mlp.up_proj.weight",
    "mlp.w_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "tok_emb.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
}
_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.(.+)$")
# The same tables read the other way (import): a name added above maps both directions.
_REFERENCE_BLOCK = {theirs: ours for ours, theirs in _BLOCK_NAMES.items()}
_REFERENCE_TOP = {theirs: ours for ours, theirs in _TOP_NAMES.items()}
_LLAMA_BLOCK_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
_TORCH_NAMES = {"fp32": "float32", "bf16": "bfloat16"}
INSTEAD = (
    "the checkpoint's model.safetensors (plain safetensors) and meta.json (its config) hold the "
    "model as Speedtronic trained it"
)


class ExportError(ConfigError):
    """A model export cannot write faithfully (exit 2): it says what export supports."""


def check_exportable(model: nn.Module, model_name: str) -> ReferenceConfig:
    """The model's ReferenceConfig, if LlamaForCausalLM can hold this model exactly."""
    if type(model) is not ReferenceTransformer:
        raise ExportError(
            f"export: model.name {model_name!r} builds a {type(model).__name__}; export writes "
            "transformers' LlamaForCausalLM from the reference transformer (model.name: "
            "reference_transformer) only",
            hint=INSTEAD,
        )
    config = model.config
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name not in MAPPED_FIELDS and value != _default(f):
            raise ExportError(
                f"export: model.{f.name}: {value!r} has no LlamaForCausalLM equivalent, so the "
                "export would compute something else; export supports the reference "
                f"transformer with {f.name} at its default ({_default(f)!r})",
                hint=INSTEAD,
            )
    unknown = [k for k in model.state_dict() if llama_name(k) is None]
    if unknown:
        raise ExportError(
            f"export: the model holds {len(unknown)} tensor(s) LlamaForCausalLM has no place "
            f"for (e.g. {unknown[0]})",
            hint=INSTEAD,
        )
    return config


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def llama_name(key: str) -> str | None:
    """The LlamaForCausalLM name of a ReferenceTransformer state_dict key; None if it has none."""
    if key in _TOP_NAMES:
        return _TOP_NAMES[key]
    match = _BLOCK_KEY.match(key)
    if match and match.group(2) in _BLOCK_NAMES:
        return f"model.layers.{match.group(1)}.{_BLOCK_NAMES[match.group(2)]}"
    return None


def reference_name(key: str) -> str | None:
    """The ReferenceTransformer name of a LlamaForCausalLM key; None if it has none."""
    if key in _REFERENCE_TOP:
        return _REFERENCE_TOP[key]
    match = _LLAMA_BLOCK_KEY.match(key)
    if match and match.group(2) in _REFERENCE_BLOCK:
        return f"blocks.{match.group(1)}.{_REFERENCE_BLOCK[match.group(2)]}"
    return None


def block_modules() -> dict[str, str]:
    """A block's modules, ours -> Llama's (``attn.wq`` -> ``self_attn.q_proj``), read from the
    same table: LoRA's target names (``train.lora``) accept either."""
    return {
        ours.removesuffix(".weight"): theirs.removesuffix(".weight")
        for ours, theirs in _BLOCK_NAMES.items()
        if ours.endswith(".weight")
    }


def layer_index(key: str) -> int | None:
    """The layer a LlamaForCausalLM key belongs to (``model.layers.<i>.``); None outside one."""
    match = _LLAMA_BLOCK_KEY.match(key)
    return int(match.group(1)) if match else None


def llama_state(model: ReferenceTransformer, dtype: str) -> dict[str, torch.Tensor]:
    """The weights under Llama's names in ``dtype`` (fp32 or bf16), CPU and contiguous; the
    tied head is stored once (as the embedding), the way transformers saves a tied model."""
    tied = model.config.tie_embeddings
    return {
        llama_name(key): value.detach().to("cpu", DTYPES[dtype]).contiguous()
        for key, value in model.state_dict().items()
        if not (tied and key == "lm_head.weight")
    }


def llama_config(
    config: ReferenceConfig, dtype: str, eos: list[int] | None = None, bos: int | None = None
) -> dict:
    """``config.json`` for LlamaForCausalLM (Qwen2ForCausalLM with ``qkv_bias``: Llama's
    attention_bias would put one on the output projection too): every field explicit (see the
    module docstring)."""
    rope = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling is not None:
        rope = {"rope_theta": config.rope_theta, **llama3_scaling(config.rope_scaling)}
    out = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.mlp_dim,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.seq_len,
        "initializer_range": config.init_std,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None
        if config.rope_scaling is None
        else llama3_scaling(config.rope_scaling),
        "rope_parameters": rope,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": bos,
        "eos_token_id": _one_or_list(eos),
        "pad_token_id": None,
        "use_cache": True,
        "torch_dtype": _TORCH_NAMES[dtype],
        "dtype": _TORCH_NAMES[dtype],
    }
    if config.qkv_bias:
        for key in ("attention_bias", "mlp_bias", "pretraining_tp"):
            del out[key]
        out.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2")
        out.update(use_sliding_window=False, sliding_window=None, max_window_layers=config.n_layer)
    return out


def llama3_scaling(scaling) -> dict:
    """ReferenceConfig.rope_scaling as transformers writes Llama-3's ``rope_scaling``."""
    factor, low, high, original = scaling
    return {
        "rope_type": "llama3",
        "factor": float(factor),
        "low_freq_factor": float(low),
        "high_freq_factor": float(high),
        "original_max_position_embeddings": int(original),
    }


def generation_config(
    config: ReferenceConfig,
    temperature: float,
    top_k: int | None,
    eos: list[int] | None = None,
    bos: int | None = None,
) -> dict:
    """``generation_config.json``: the defaults of ``speedtronic generate``, the run's
    end-of-document tokens as EOS (``modelout.stops``), and no ``max_length`` (transformers
    warns on every ``generate(max_new_tokens=...)`` beside one)."""
    out: dict = {"bos_token_id": bos, "eos_token_id": _one_or_list(eos), "pad_token_id": None}
    if temperature > 0:
        out.update(do_sample=True, temperature=temperature, top_k=top_k or 0)
    else:
        out["do_sample"] = False
    return out


def _one_or_list(ids: list[int] | None) -> int | list[int] | None:
    if not ids:
        return None
    return ids[0] if len(ids) == 1 else sorted(ids)

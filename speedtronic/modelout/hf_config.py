"""A transformers ``config.json`` read as the reference transformer's ``model:`` keys. Stdlib only.

Import's half of the config mapping (``llama.llama_config`` is export's): a Llama-shaped
config (Llama, or Qwen2: a q/k/v bias) becomes ``ReferenceConfig`` keyword arguments, an
explicit ``head_dim`` and Llama-3 RoPE scaling included, every field transformers defaults when it
is absent read with transformers' own default (Llama's ``rms_norm_eps`` 1e-6, untied head,
2,048 positions). Anything the reference transformer would compute differently is refused in
one line naming the field and its value, before anything is read or written: another
architecture (GPT-2, ...), an activation other than SiLU, a bias on the output or MLP
projections, a RoPE scaling other than Llama-3's, a sliding window, experts (MoE), a quantized
checkpoint.
"""

from __future__ import annotations

from typing import Any

from speedtronic.errors import ConfigError

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
SUPPORTED = "Llama-shaped decoders (model_type llama or qwen2: SmolLM2, TinyLlama, Qwen2.5, ...)"
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# Fields a Mixture-of-Experts config carries (Mixtral, Qwen-MoE, DeepSeek, OLMoE).
_EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")


class UnsupportedModel(ConfigError):
    """A model the reference transformer cannot compute exactly (exit 2)."""


def reference_params(config: dict[str, Any], where: str) -> dict[str, Any]:
    """``model:`` keys (reference_transformer) for the transformers ``config`` read from
    ``where``; an UnsupportedModel naming the field and value for anything that would not map."""
    _check_architecture(config, where)
    _check_features(config, where)
    hidden, heads = _int(config, "hidden_size", where), _int(config, "num_attention_heads", where)
    params = {
        "vocab_size": _int(config, "vocab_size", where),
        "seq_len": _int(config, "max_position_embeddings", where, 2048),
        "n_layer": _int(config, "num_hidden_layers", where),
        "n_head": heads,
        "n_kv_head": _int(config, "num_key_value_heads", where, heads),
        "d_model": hidden,
        "mlp_hidden": _int(config, "intermediate_size", where),
        "rope_theta": float(_number(config, "rope_theta", where, _rope_theta(config))),
        "norm_eps": float(_number(config, "rms_norm_eps", where, 1e-6)),
        "init_std": float(_number(config, "initializer_range", where, 0.02)),
        "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
    }
    head_dim = config.get("head_dim")
    if head_dim is not None and (hidden % heads or head_dim != hidden // heads):
        params["head_dim"] = _int(config, "head_dim", where)
    if config.get("model_type") == "qwen2":
        params["qkv_bias"] = True  # Qwen2's q/k/v projections always carry one
    if _rope_type(config) == "llama3":
        params["rope_scaling"] = _llama3(config, where)
    return params


def _check_architecture(config: dict[str, Any], where: str) -> None:
    model_type = config.get("model_type")
    if model_type not in ARCHITECTURES:
        _refuse(where, "model_type", model_type, f"import reads {SUPPORTED}")
    archs = config.get("architectures") or [ARCHITECTURES[model_type]]
    if archs != [ARCHITECTURES[model_type]]:
        _refuse(where, "architectures", archs, f"import reads {ARCHITECTURES[model_type]}")


def _check_features(config: dict[str, Any], where: str) -> None:
    if config.get("hidden_act", "silu") != "silu":
        _refuse(where, "hidden_act", config["hidden_act"], "the reference MLP is SwiGLU (silu)")
    for name in ("attention_bias", "mlp_bias"):
        if config.get(name):
            _refuse(where, name, config[name], "the reference transformer has no biases")
    # Qwen2 configs name a window they do not use unless use_sliding_window says so
    window = config.get("sliding_window") is not None and "use_sliding_window" not in config
    if config.get("use_sliding_window") or window:
        value = config.get("sliding_window")
        _refuse(where, "sliding_window", value, "the reference attention sees the whole context")
    for name in _EXPERT_FIELDS:
        if config.get(name):
            _refuse(where, name, config[name], "a Mixture-of-Experts model is not supported")
    if config.get("quantization_config"):
        _refuse(where, "quantization_config", "(set)", "import reads unquantized weights")
    kind = _rope_type(config)
    if kind not in (None, "default", "llama3"):
        _refuse(where, "rope_scaling.rope_type", kind, "only default and llama3 RoPE map")


def _rope_type(config: dict[str, Any]) -> Any:
    """The RoPE scaling kind, from ``rope_scaling`` (4.x) or ``rope_parameters`` (5.x)."""
    for name in ("rope_scaling", "rope_parameters"):
        value = config.get(name)
        if isinstance(value, dict) and (value.get("rope_type") or value.get("type")):
            return value.get("rope_type") or value.get("type")
        if value is not None and not isinstance(value, dict):
            return value
    return None


def _llama3(config: dict[str, Any], where: str) -> list:
    """Llama-3's four scaling numbers, as ReferenceConfig.rope_scaling holds them."""
    scaling = next(
        config[name]
        for name in ("rope_scaling", "rope_parameters")
        if isinstance(config.get(name), dict) and config[name].get("rope_type") == "llama3"
    )
    values = [_number(scaling, key, where, None) for key in _LLAMA3_KEYS]
    values[3] = _int(scaling, "original_max_position_embeddings", where)
    if not values[1] < values[2]:
        _refuse(where, "rope_scaling", scaling, "low_freq_factor must be < high_freq_factor")
    return values


def _rope_theta(config: dict[str, Any]) -> Any:
    params = config.get("rope_parameters")
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return 10000.0 if theta is None else theta


def _int(config: dict[str, Any], name: str, where: str, default: Any = None) -> int:
    value = config.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        _refuse(where, name, value, "must be a positive integer")
    return value


def _number(config: dict[str, Any], name: str, where: str, default: Any) -> float:
    value = config.get(name)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        _refuse(where, name, value, "must be a positive number")
    return value


def _refuse(where: str, field: str, value: Any, rule: str) -> None:
    raise UnsupportedModel(f"{where}: {field}: {value!r} is not supported: {rule}; nothing written")

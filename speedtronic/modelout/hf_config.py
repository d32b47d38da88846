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

Every value is then held to the rules a run's config is (``SpeedtronicConfig``'s model section and
``registry.reference_config``: finite numbers, ranges, heads that divide, an even head width),
and so is every number anywhere in config.json (no NaN or infinity), each problem named by
config.json's key: ``config.json: rope_theta: must be finite (got inf)``. What import writes is
what ``generate`` and ``train`` can rebuild. Stdlib only at import time: the rules are imported
when applied.
"""

from __future__ import annotations

import math
import re
from typing import Any

from speedtronic.errors import ConfigError

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
SUPPORTED = "Llama-shaped decoders (model_type llama or qwen2: SmolLM2, TinyLlama, Qwen2.5, ...)"
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# Fields a Mixture-of-Experts config carries (Mixtral, Qwen-MoE, DeepSeek, OLMoE).
_EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")
_ROPE_FIELDS = ("rope_scaling", "rope_parameters")  # transformers 4.x, 5.x
# config.json's name of each reference key, for the messages (the RoPE ones depend on the file)
_THEIR_NAMES = {
    "vocab_size": "vocab_size",
    "seq_len": "max_position_embeddings",
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_kv_head": "num_key_value_heads",
    "d_model": "hidden_size",
    "mlp_hidden": "intermediate_size",
    "norm_eps": "rms_norm_eps",
    "init_std": "initializer_range",
    "tie_embeddings": "tie_word_embeddings",
    "head_dim": "head_dim",
}


class UnsupportedModel(ConfigError):
    """A model the reference transformer cannot compute exactly (exit 2)."""


def reference_params(config: dict[str, Any], where: str) -> dict[str, Any]:
    """``model:`` keys (reference_transformer) for the transformers ``config`` read from
    ``where``; a ConfigError naming config.json's keys for anything that would not map or that a
    run's config would refuse (see the module docstring)."""
    _check_finite(config, where)
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
        "rope_theta": _number(config, "rope_theta", where, _rope_theta(config)),
        "norm_eps": _number(config, "rms_norm_eps", where, 1e-6),
        "init_std": _number(config, "initializer_range", where, 0.02),
        "tie_embeddings": config.get("tie_word_embeddings", False),
    }
    head_dim = config.get("head_dim")
    if head_dim is not None and (hidden % heads or head_dim != hidden // heads):
        params["head_dim"] = _int(config, "head_dim", where)
    if config.get("model_type") == "qwen2":
        params["qkv_bias"] = True  # Qwen2's q/k/v projections always carry one
    if _rope_type(config) == "llama3":
        params["rope_scaling"] = _llama3(config, where)
    _check_run_rules(params, config, where)
    for name in ("rope_theta", "norm_eps", "init_std"):  # finite now: float() cannot overflow
        params[name] = float(params[name])
    return params


def _check_run_rules(params: dict[str, Any], config: dict[str, Any], where: str) -> None:
    """The rules a run's ``model:`` section is held to, in config.json's words."""
    from speedtronic.config import SpeedtronicConfig
    from speedtronic.registry import reference_config

    problems: list[str] = []
    for check in (
        lambda: SpeedtronicConfig.load({"model": {"name": "reference_transformer", **params}}),
        lambda: reference_config(params),
    ):
        try:
            check()
        except ConfigError as exc:
            problems += [p for p in exc.problems if p not in problems]
    if problems:
        names = _their_names(config)
        words = [_in_their_words(p.removeprefix("model."), names) for p in problems]
        raise ConfigError(f"{where}: {'; '.join(words)}; nothing written")


def _their_names(config: dict[str, Any]) -> dict[str, str]:
    theta = "rope_theta" if "rope_theta" in config else "rope_parameters.rope_theta"
    rope = _rope_source(config)
    return {**_THEIR_NAMES, "rope_theta": theta, "rope_scaling": rope[0] if rope else "rope"}


def _in_their_words(problem: str, names: dict[str, str]) -> str:
    """``n_kv_head: must divide n_head=4`` as ``num_key_value_heads: must divide
    num_attention_heads=4``: every reference key named as config.json names it."""
    pattern = r"\b(" + "|".join(map(re.escape, names)) + r")\b"
    return re.sub(pattern, lambda m: names[m.group(1)], problem)


def _check_finite(config: dict[str, Any], where: str) -> None:
    """No NaN or infinity anywhere in config.json (json reads ``Infinity`` and ``1e999``)."""
    problems = _non_finite(config, "")
    if problems:
        raise ConfigError(f"{where}: {'; '.join(problems)}; nothing written")


def _non_finite(value: Any, path: str) -> list[str]:
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{path}: must be finite (got {value})"]
    if isinstance(value, dict):
        items = ((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return []
    return [problem for key, item in items for problem in _non_finite(item, key)]


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
    for name in _ROPE_FIELDS:
        if config.get(name) is not None and not isinstance(config[name], dict):
            _invalid(where, name, config[name], "must be a mapping with a rope_type, or null")
    kind = _rope_type(config)
    if kind not in (None, "default", "llama3"):
        field = f"{_rope_source(config)[0]}.rope_type"
        _refuse(where, field, kind, "only default and llama3 RoPE map")


def _rope_source(config: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The field that states the RoPE scaling kind and its mapping (``rope_scaling`` in 4.x,
    ``rope_parameters`` in 5.x); None when neither states one."""
    for name in _ROPE_FIELDS:
        value = config.get(name)
        if isinstance(value, dict) and (value.get("rope_type") or value.get("type")):
            return name, value
    return None


def _rope_type(config: dict[str, Any]) -> Any:
    source = _rope_source(config)
    return None if source is None else source[1].get("rope_type") or source[1].get("type")


def _llama3(config: dict[str, Any], where: str) -> list:
    """Llama-3's four scaling numbers, as ReferenceConfig.rope_scaling holds them."""
    name, scaling = _rope_source(config)
    values = [_number(scaling, key, where, None, f"{name}.") for key in _LLAMA3_KEYS[:3]]
    return [*values, _int(scaling, _LLAMA3_KEYS[3], where, None, f"{name}.")]


def _rope_theta(config: dict[str, Any]) -> Any:
    params = config.get("rope_parameters")
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return 10000.0 if theta is None else theta


def _int(config: dict[str, Any], name: str, where: str, default: Any = None, at="") -> int:
    value = config.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        _invalid(where, at + name, value, "must be a positive integer")
    return value


def _number(config: dict[str, Any], name: str, where: str, default: Any, at="") -> float:
    value = config.get(name)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        _invalid(where, at + name, value, "must be a positive number")
    return value


def _invalid(where: str, field: str, value: Any, rule: str) -> None:
    raise ConfigError(f"{where}: {field}: {rule} (got {value!r}); nothing written")


def _refuse(where: str, field: str, value: Any, rule: str) -> None:
    raise UnsupportedModel(f"{where}: {field}: {value!r} is not supported: {rule}; nothing written")

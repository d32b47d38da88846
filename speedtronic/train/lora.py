"""LoRA adapters through peft: the one module that imports peft (the ``lora`` extra).

``model.lora`` (``config.sections.LoraConfig``) adds low-rank adapters to a model's linear
layers with peft's ``inject_adapter_in_model``, which replaces each targeted ``nn.Linear`` in
place by peft's ``lora.Linear`` (the frozen layer as its ``base_layer``, plus ``lora_A`` and
``lora_B``) and keeps the model's own class and module names: its forward, ``generate``,
evaluation and the trainer work unchanged. Only the adapters are trainable; the optimizer sees
only them (``optim.build`` takes parameters with ``requires_grad``).

Names: a target is a module name of the model (``attn.wq``, matched as peft does, on the
dotted suffix) or its Llama/peft name (``q_proj``, ``self_attn.q_proj``), translated through
``modelout.llama``'s one mapping table. A target that names no linear layer of the model is
refused in one line listing the names there are.

Checkpoints hold the adapters only, under the model's names without peft's adapter name
(``blocks.0.attn.wq.lora_A.weight``: ``adapter_state``); the base is named by its source and
``base_sha256``, a digest of its tensors' bytes whatever file format held them, so a resumed
run (or a fleet node) proves it holds the same base. ``merge`` folds the adapters into the
base weights and gives back the plain model (export, generate, eval); ``peft_adapter`` gives
peft's own file layout for ``export --adapter``.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from speedtronic.config.sections import LoraConfig
from speedtronic.errors import ConfigError

ADAPTER = "default"  # peft's adapter name; never written into our files
KEY = "model.lora.target_modules"


def wrap(model: nn.Module, lora: LoraConfig) -> nn.Module:
    """``model`` with adapters on ``lora.target_modules`` (in place), only they trainable."""
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import inject_adapter_in_model
    except ImportError as exc:
        raise ConfigError(
            "model.lora: needs peft, which is not installed",
            hint="pip install 'speedtronic[lora]'",
        ) from exc
    targets = resolve_targets(model, lora.target_modules)
    config = PeftLoraConfig(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets
    )
    for param in model.parameters():  # the base is frozen: peft freezes it too, say it here
        param.requires_grad_(False)
    inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    for name, param in model.named_parameters():
        param.requires_grad_(_is_adapter(name))
    return model


def resolve_targets(model: nn.Module, names: list[str]) -> list[str]:
    """Each target as the model's own module suffix (``attn.wq``), or a ConfigError naming the
    value and the names there are."""
    linears = _linear_names(model)
    aliases = _aliases(linears)
    resolved = []
    for name in names:
        own = aliases.get(name, name)
        if not any(_matches(path, own) for path in linears):
            raise ConfigError(
                f"{KEY}: {name!r} names no linear layer of this model; available: "
                f"{', '.join(available_names(model))}"
            )
        resolved.append(own)
    return resolved


def describe(model: nn.Module, lora: LoraConfig) -> str:
    """``validate``'s line: the targets and the adapters' size, counted (``model`` may be on
    the meta device); a target naming no layer is the ConfigError ``wrap`` would raise."""
    targets = resolve_targets(model, lora.target_modules)
    layers = [
        m
        for path, m in model.named_modules()
        if isinstance(m, nn.Linear) and any(_matches(path, t) for t in targets)
    ]
    adapters = sum(lora.r * (m.in_features + m.out_features) for m in layers)
    total = sum(p.numel() for p in model.parameters())
    return (
        f"r {lora.r}, alpha {lora.alpha:g} on {len(layers)} layers ({', '.join(targets)}): "
        f"{adapters:,} trainable parameters ({adapters / (total + adapters):.2%})"
    )


def available_names(model: nn.Module) -> list[str]:
    """The target names a user may give: Llama's where the table maps them, else the model's."""
    linears = _linear_names(model)
    aliases = _aliases(linears)
    shown = [alias for alias in aliases if "." not in alias]  # q_proj, not self_attn.q_proj
    mapped = set(aliases.values())
    shown += sorted({_tail(p) for p in linears} - mapped)
    return shown


def _linear_names(model: nn.Module) -> list[str]:
    """The model's adaptable layers: every nn.Linear but a head tied to the embedding."""
    tied = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return [
        path
        for path, m in model.named_modules()
        if isinstance(m, nn.Linear) and id(m.weight) not in tied
    ]


def _aliases(linears: list[str]) -> dict[str, str]:
    """Llama names -> the model's (``q_proj`` and ``self_attn.q_proj`` -> ``attn.wq``), for
    the layers this model has."""
    from speedtronic.modelout.llama import block_modules

    out = {}
    for ours, theirs in block_modules().items():
        if any(_matches(path, ours) for path in linears):
            out[theirs.rpartition(".")[2]] = ours
            out[theirs] = ours
    return out


def _matches(path: str, target: str) -> bool:
    """peft's rule for a string in a list: the full name, or a suffix after a dot."""
    return path == target or path.endswith("." + target)


def _tail(path: str) -> str:
    """A layer's name inside its repeated block (``blocks.3.attn.wq`` -> ``attn.wq``)."""
    parts = path.split(".")
    digits = [i for i, part in enumerate(parts) if part.isdigit()]
    return ".".join(parts[digits[-1] + 1 :]) if digits else path


def _is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


# ---- what a checkpoint holds ---------------------------------------------------------------


def is_wrapped(model: nn.Module) -> bool:
    return any(_is_adapter(name) for name, _ in model.named_parameters())


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' tensors, ``blocks.0.attn.wq.lora_A.weight`` (peft's adapter name out)."""
    return adapters_of(model.state_dict())


def adapters_of(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters' entries of a wrapped model's state, under ``adapter_state``'s names (a
    fleet's final global: the model's state with the global's adapters in it)."""
    tag = f".{ADAPTER}."
    return {name.replace(tag, "."): value for name, value in state.items() if _is_adapter(name)}


def load_adapter_state(model: nn.Module, state: dict[str, torch.Tensor]) -> str:
    """Copy ``state`` (``adapter_state``'s names) into the model's adapters; "" when it fits
    exactly, else how it does not (missing, unexpected, reshaped), nothing copied."""
    from speedtronic.checkpoint.plugin import state_mismatch

    ours = adapter_state(model)
    why = state_mismatch(ours, state)
    if why:
        return why
    with torch.no_grad():
        for name, tensor in ours.items():
            tensor.copy_(state[name])
    return ""


def base_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The frozen base under the plain model's names (``base_layer`` out, adapters out)."""
    return {
        name.replace(".base_layer.", "."): value
        for name, value in model.state_dict().items()
        if not _is_adapter(name)
    }


def base_sha256(state: dict[str, torch.Tensor]) -> str:
    """A digest of a model's weights: names, dtypes, shapes and bytes, in name order. The same
    tensors give the same digest whether they came from safetensors, a checkpoint or an
    import; any changed bit changes it."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{list(tensor.shape)}\n".encode())
        flat = tensor.reshape(-1)  # a 0-dim tensor has no byte view; the shape is hashed above
        digest.update(flat.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def record(lora: LoraConfig, targets: list[str], source: str, sha256: str) -> dict[str, Any]:
    """What a LoRA checkpoint's meta.json says of its adapters and base (``meta["lora"]``):
    the settings, the targets as the model's names, the base's source and sha256."""
    return {**asdict(lora), "targets": targets, "base": {"source": source, "sha256": sha256}}


@dataclass
class Adapters:
    """A LoRA run's adapters as the checkpoint plug-in sees them (``Runtime.adapters``): what
    to save in place of the whole model, what to load on resume, and the meta.json record."""

    record: dict[str, Any]

    def state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return adapter_state(model)

    def load(self, model: nn.Module, state: dict[str, torch.Tensor]) -> str:
        return load_adapter_state(model, state)


def adapt(model: nn.Module, lora: LoraConfig, source: str, expected: str | None = None) -> Adapters:
    """Wrap ``model``, whose base weights are loaded, and name its base: ``source`` and the
    sha256 of its weights, which must be ``expected`` when given (a resumed run's base)."""
    sha256 = base_sha256(model.state_dict())
    if expected is not None and sha256 != expected:
        raise ConfigError(
            f"checkpoint.init_from: {source} is not the base this LoRA run trained on (its "
            f"weights' sha256 is {sha256[:12]}..., the checkpoint's base {expected[:12]}...); "
            "pass the same model with --init-from"
        )
    targets = resolve_targets(model, lora.target_modules)
    wrap(model, lora)
    return Adapters(record(lora, targets, source, sha256))


def adapt_run(
    model: nn.Module,
    lora: LoraConfig,
    source: str,
    expected: str | None,
    notice: Callable[[str], None],
) -> Adapters:
    """``adapt`` for a run: the start-up line says what trains and what the base is."""
    adapters = adapt(model, lora, source, expected)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    base = adapters.record["base"]
    notice(
        f"model.lora: r {lora.r} on {', '.join(adapters.record['targets'])}: {trainable:,} "
        f"trainable parameters ({trainable / total:.2%} of {total:,}); the base is "
        f"{base['source']} (sha256 {base['sha256'][:12]}...), frozen"
    )
    return adapters


def open_base(model: nn.Module, record: Any, where: str, log: Callable[[str], None]) -> LoraConfig:
    """Load into ``model`` (built from a LoRA checkpoint's config) the base its meta.json
    ``record`` names, checked by sha256; returns the run's LoRA settings. ``where`` names the
    checkpoint in errors."""
    from speedtronic.checkpoint.plugin import state_mismatch
    from speedtronic.train.init_source import open_init_source

    base = record.get("base") if isinstance(record, dict) else None
    if not isinstance(base, dict) or not all(isinstance(base.get(k), str) for k in BASE_KEYS):
        raise ConfigError(f"{where}: meta.json's lora record names no base (lora.base)")
    try:
        lora = LoraConfig(record["r"], record["alpha"], record["dropout"], record["targets"])
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"{where}: meta.json's lora record is incomplete ({exc})") from None
    weights = open_init_source(base["source"], log).load().model_state
    why = state_mismatch(model.state_dict(), weights)
    if why:
        raise ConfigError(f"{where}: its LoRA base {base['source']} does not fit: {why}")
    model.load_state_dict(weights, strict=True)
    found = base_sha256(model.state_dict())
    if found != base["sha256"]:
        raise ConfigError(
            f"{where}: its LoRA base {base['source']} has changed since the run (its weights' "
            f"sha256 is {found[:12]}..., the run's base {base['sha256'][:12]}...)"
        )
    return lora


def open_adapted(
    model: nn.Module,
    record: Any,
    state: dict[str, torch.Tensor],
    where: str,
    log: Callable[[str], None],
) -> nn.Module:
    """``open_base``, then the adapters ``state`` on it: the model the LoRA run trained."""
    lora = open_base(model, record, where, log)
    wrap(model, lora)
    why = load_adapter_state(model, state)
    if why:
        raise ConfigError(f"{where}: the adapters do not fit its LoRA settings: {why}")
    return model


BASE_KEYS = ("source", "sha256")


def merge(model: nn.Module) -> nn.Module:
    """The plain model: each adapted layer replaced by its base with B A x alpha/r added in
    (peft's merge), so it computes what the adapted model did and holds no adapter."""
    from peft.tuners.lora import LoraLayer

    for path, module in list(model.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge(safe_merge=True)
            parent_path, _, child = path.rpartition(".")
            parent = model.get_submodule(parent_path) if parent_path else model
            setattr(parent, child, module.get_base_layer())
    for param in model.parameters():
        param.requires_grad_(True)
    return model


# ---- peft's own layout (export --adapter) --------------------------------------------------


def peft_adapter(
    record: dict[str, Any], state: dict[str, torch.Tensor], rename: Any, base_name: str | None
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``adapter_config.json`` and ``adapter_model.safetensors``'s tensors as peft writes them
    for a transformers model, from a checkpoint's ``lora`` record and adapter tensors:
    ``rename`` maps a weight's name to transformers' (``modelout.llama.llama_name``); keys
    become ``base_model.model.<its name>.lora_A.weight``."""
    from peft import LoraConfig as PeftLoraConfig

    tensors = {}
    for name, value in state.items():
        layer, _, kind = name.rpartition(".lora_")  # blocks.0.attn.wq | A.weight
        theirs = rename(f"{layer}.weight")
        if theirs is None:
            raise ConfigError(f"export --adapter: the layer {layer} has no transformers name")
        stem = theirs.removesuffix(".weight")
        tensors[f"base_model.model.{stem}.lora_{kind}"] = value.detach().cpu().contiguous()
    targets = sorted({key.split(".")[-3] for key in tensors})  # q_proj, ...
    config = PeftLoraConfig(
        r=record["r"],
        lora_alpha=record["alpha"],
        lora_dropout=record["dropout"],
        target_modules=targets,
        base_model_name_or_path=base_name,
        task_type="CAUSAL_LM",
    ).to_dict()
    return _json_plain(config), tensors


def _json_plain(value: Any) -> Any:
    """peft's config dict with sets as sorted lists and enums as strings (JSON)."""
    if isinstance(value, dict):
        return {k: _json_plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_json_plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_json_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value  # PeftType, TaskType
    return value


def load_peft_adapter(model: Any, folder: str) -> Any:
    """transformers' ``model`` with the adapter in ``folder`` loaded by peft
    (``PeftModel.from_pretrained``): ``export --verify``'s check of what it wrote."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, folder)

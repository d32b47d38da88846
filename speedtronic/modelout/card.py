"""The model card (``README.md``) of an export: what the model is, how it was made and loaded.

Hub metadata up front (``library_name: transformers``, ``pipeline_tag: text-generation``, the
``base_model`` an imported model or a run started from one came from: ``base_model``), then
the architecture and its sizes, the parameter count, the tokenizer, the training (steps,
tokens, the final training loss and the last evaluation loss the run's metrics recorded), how
to load it with transformers and with Speedtronic, and the config that trained it (the
checkpoint's copy, secrets already redacted). Stdlib and PyYAML only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from speedtronic.checkpoint.inspection import metrics_file
from speedtronic.data.tokenizer import ByteTokenizer
from speedtronic.model import ReferenceConfig
from speedtronic.observe.history import read_history


@dataclass
class CardFacts:
    """What the card says; ``where`` is how a reader loads it (a Hub repo id or a path)."""

    name: str
    where: str
    config: ReferenceConfig
    params: int
    dtype: str
    meta: dict[str, Any]
    stored_config: dict[str, Any]
    tokenizer: Any
    eval_loss: tuple[int, float] | None
    base_model: str | None = None  # the Hub repo id (or name) of the model it started from


def last_eval_loss(checkpoint: Path, meta: dict) -> tuple[int, float] | None:
    """(step, eval loss) of the run's last evaluation at or before the checkpoint's step: as
    meta.json records it, else from the run's metrics JSONL when that is still beside the
    checkpoints; None when there is none."""
    step, recorded = int(meta.get("step") or 0), meta.get("eval_loss")
    if isinstance(recorded, dict) and isinstance(recorded.get("loss"), (int, float)):
        return int(recorded.get("step") or step), float(recorded["loss"])
    path = metrics_file(checkpoint.parent, [checkpoint])
    try:
        history = read_history(path) if path is not None else None
    except OSError:
        return None
    points = [(p["step"], p["eval_loss"]) for p in (history or {}).get("eval_losses", [])]
    points = [(s, v) for s, v in points if s <= step and v is not None]
    return points[-1] if points else None


def base_model(meta: dict, stored_config: dict) -> str | None:
    """The model the run started from: an import's source, or a run's ``init_from`` (a Hub
    model, or an import's directory): its Hub repo id, else its directory's name."""
    imported = meta.get("imported_from")
    origin = imported.get("source") if isinstance(imported, dict) else None
    if origin is None:
        section = stored_config.get("checkpoint") if isinstance(stored_config, dict) else None
        init = section.get("init_from") if isinstance(section, dict) else None
        origin = init if str(init).startswith("hf://") else _import_source(init)
    if not isinstance(origin, str) or not origin:
        return None
    if origin.startswith("hf://"):
        return origin.removeprefix("hf://").partition("@")[0]
    return Path(origin).name or None


def _import_source(run: Any) -> str | None:
    """The source an import's directory came from (``importer.IMPORT_MARK``), if ``run`` is one."""
    if not isinstance(run, str):
        return None
    try:
        mark = Path(run, "speedtronic_import.json")
        source = json.loads(mark.read_text(encoding="utf-8")).get("source")
    except (OSError, ValueError, AttributeError):
        return None  # not an import's directory: no base model to name
    return source if isinstance(source, str) else None


def model_card(facts: CardFacts) -> str:
    cfg, meta = facts.config, facts.meta
    tokenizer = (
        "byte-level: the ids are the UTF-8 bytes (256)"
        if isinstance(facts.tokenizer, ByteTokenizer)
        else f"a tokenizers file ({getattr(facts.tokenizer, 'vocab_size', '?')} tokens), "
        "without special tokens added"
    )
    evaluated = facts.eval_loss
    rows = [
        ("architecture", _architecture(cfg)),
        ("parameters", f"{facts.params:,}"),
        ("layers / heads / key-value heads", f"{cfg.n_layer} / {cfg.n_head} / {cfg.kv_heads}"),
        ("hidden size / MLP size / head size", f"{cfg.d_model} / {cfg.mlp_dim} / {cfg.head_dim}"),
        ("context length", f"{cfg.seq_len} tokens"),
        ("RoPE theta / RMSNorm eps", f"{cfg.rope_theta:g} / {cfg.norm_eps:g}"),
        ("tied embeddings", "yes" if cfg.tie_embeddings else "no"),
        ("vocabulary", f"{cfg.vocab_size}; tokenizer {tokenizer}"),
        ("weights", facts.dtype),
    ]
    diloco = meta.get("diloco") if isinstance(meta.get("diloco"), dict) else None
    # a DumbDiLoCo final global: "step" is its outer step, the fleet's steps are counted apart
    steps = meta.get("optimizer_steps") if diloco else meta.get("step")
    training = [
        (
            "optimizer steps",
            _count(steps) + (" (the fleet's, added up)" if diloco and steps else ""),
        ),
        ("tokens trained", _count(meta.get("tokens"))),
        *([("DumbDiLoCo outer steps", _count(meta.get("step")))] if diloco else []),
        ("final training loss", _loss(meta.get("loss"))),
        (
            "eval loss",
            f"{evaluated[1]:.4f} at step {evaluated[0]}" if evaluated else "not recorded",
        ),
    ]
    return "\n".join(
        [
            "---",
            "library_name: transformers",
            "pipeline_tag: text-generation",
            *([f"base_model: {json.dumps(facts.base_model)}"] if facts.base_model else []),
            "tags:",
            "- speedtronic",
            "- llama",
            "- text-generation",
            "---",
            "",
            f"# {facts.name}",
            "",
            "A decoder-only language model trained with Speedtronic and exported to transformers'",
            "`LlamaForCausalLM` (`speedtronic export`).",
            "",
            "## Model",
            "",
            _table(rows),
            "",
            "## Training",
            "",
            _table(training),
            "",
            "## How to use it",
            "",
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f"model = AutoModelForCausalLM.from_pretrained({facts.where!r})",
            f"tokenizer = AutoTokenizer.from_pretrained({facts.where!r})",
            'ids = tokenizer("Once upon a time", return_tensors="pt").input_ids',
            "out = model.generate(ids, max_new_tokens=50, do_sample=True)",
            "print(tokenizer.decode(out[0]))",
            "```",
            "",
            "The tokenizer adds no BOS or EOS token: the model was trained without them, and its",
            f"context is {cfg.seq_len} tokens. The config and tokenizer files state every setting",
            "explicitly, so transformers 4.57 and 5 load the same model.",
            "",
            "## The config that trained it",
            "",
            "```yaml",
            yaml.safe_dump(facts.stored_config, sort_keys=False).rstrip(),
            "```",
            "",
            "Provenance (the checkpoint this export was written from) is in",
            "`speedtronic_export.json`.",
            "",
        ]
    )


def _architecture(cfg: ReferenceConfig) -> str:
    if cfg.qkv_bias:  # exported as Qwen2ForCausalLM (modelout.llama)
        return (
            "Qwen2ForCausalLM (Speedtronic's reference decoder: RoPE, grouped-query attention "
            "with a bias on q/k/v, SwiGLU, RMSNorm)"
        )
    return (
        "LlamaForCausalLM (Speedtronic's reference decoder: RoPE, grouped-query attention, "
        "SwiGLU, RMSNorm, no biases)"
    )


def _table(rows: list[tuple[str, str]]) -> str:
    lines = ["| | |", "|---|---|"]
    return "\n".join(lines + [f"| {k} | {v} |" for k, v in rows])


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else "unknown"


def _loss(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else "not recorded"


def json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()

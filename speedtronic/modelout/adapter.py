"""``speedtronic export --adapter``: a LoRA run's adapters in peft's own layout.

``export_adapter`` writes ``adapter_config.json`` (peft's ``LoraConfig``, the targets under
transformers' names: ``q_proj``, ...) and ``adapter_model.safetensors`` (keys as peft saves
them for a ``LlamaForCausalLM``: ``base_model.model.model.layers.0.self_attn.q_proj.lora_A
.weight``), so ``PeftModel.from_pretrained(base, OUT)`` loads them onto the exported base (or
the transformers model the run was fine-tuned from), plus export's mark
(``speedtronic_export.json``). Written as export writes: in a ``.tmp-*`` sibling, checked when
asked (``--verify``: transformers + peft against the run's logits), then renamed into place.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from speedtronic.checkpoint.files import fsync_file, install_dir
from speedtronic.checkpoint.layout import TMP_PREFIX
from speedtronic.errors import ConfigError
from speedtronic.modelout import llama
from speedtronic.modelout.card import json_bytes
from speedtronic.modelout.export import (
    EXPORT_FORMAT,
    Export,
    _record_of,
    _umask,
    _write_error,
    check_out,
    link_target,
    write_mark,
    write_synced,
)
from speedtronic.modelout.source import RunModel

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def export_adapter(
    run: RunModel, out: str | Path, dtype: str = "fp32", verify: Callable[[Path], Any] | None = None
) -> Export:
    """Write ``run``'s LoRA adapters to ``out`` in peft's layout (see the module docstring)."""
    from speedtronic.train import lora

    if run.lora is None or run.adapters is None:
        raise ConfigError(
            f"--adapter: {run.checkpoint} is not a LoRA run (its meta.json records no lora); "
            "export it without --adapter"
        )
    if dtype not in llama.DTYPES:
        raise ConfigError(f"--dtype: must be one of {', '.join(llama.DTYPES)} (got {dtype!r})")
    llama.check_exportable(run.model, run.model_name)  # the base must be Llama's to load onto
    config, tensors = lora.peft_adapter(run.lora, run.adapters, llama.llama_name, base_name(run))
    tensors = {k: v.to(llama.DTYPES[dtype]) for k, v in tensors.items()}
    given = Path(out)
    out = link_target(given)
    replaced = check_out(out)
    tmp = out.parent / f"{TMP_PREFIX}export-{out.name}-{os.getpid()}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # ours, from an earlier attempt
        tmp.mkdir()
        written = _write(tmp, run, json_bytes(config), tensors, dtype)
        verified = verify(tmp) if verify is not None else None
        install_dir(tmp, out)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        written_error = _write_error(exc, out)
        if written_error is None:
            raise
        raise written_error from exc
    return Export(given, written, replaced, verified)


def base_name(run: RunModel) -> str | None:
    """``base_model_name_or_path``: the run's base where transformers can load it (a Hub repo
    or a transformers directory); None for a Speedtronic run (export that run for a base)."""
    source = str((run.lora or {}).get("base", {}).get("source", ""))
    if source.startswith("hf://"):
        return source[len("hf://") :].partition("@")[0]
    return source if source and (Path(source) / "config.json").is_file() else None


def _write(tmp: Path, run: RunModel, config: bytes, tensors: dict, dtype: str) -> dict[str, int]:
    save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    os.chmod(tmp / ADAPTER_WEIGHTS, 0o666 & ~_umask())  # as export's weights: the user's umask
    fsync_file(tmp / ADAPTER_WEIGHTS)
    records = {ADAPTER_WEIGHTS: _record_of(tmp / ADAPTER_WEIGHTS)}
    records[ADAPTER_CONFIG] = write_synced(tmp / ADAPTER_CONFIG, config)
    mark = {
        "written_by": "speedtronic export",
        "format": EXPORT_FORMAT,
        "kind": "lora-adapter",
        "dtype": dtype,
        "source": {
            "run_id": run.meta.get("run_id"),
            "step": run.meta.get("step"),
            "checkpoint": run.checkpoint.name,
            "base": (run.lora or {}).get("base"),
        },
        "files": records,
    }
    return write_mark(tmp, mark)

"""A pretrained transformers model as the reference transformer: where it is, its keys, its weights.

SRC is a local transformers directory (``config.json`` + safetensors weights, one file or
shards with ``model.safetensors.index.json``) or ``hf://OWNER/NAME[@REV]``, downloaded through
the project's one Hub client (``speedtronic.hub.models.download_model``) into the user cache
at its commit, so the same revision is fetched once. Pickled weights are never read: a
directory holding only ``pytorch_model.bin`` is refused. ``open_source`` reads what decides
whether it maps (``hf_config``), the tensors' names, shapes and dtypes from the safetensors
headers alone, and refuses any mismatch before anything is loaded or written; ``load_state``
then reads the tensors one at a time under the reference transformer's names (one copy in
memory, in the file's dtype). Both ``speedtronic import`` and ``train --init-from`` use it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from speedtronic.errors import ConfigError
from speedtronic.modelout import hf_config, llama

HUB_PREFIX = "hf://"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)
_DTYPES = ("F32", "BF16", "F16")
_IGNORED = ("rotary_emb.inv_freq",)  # buffers some old checkpoints saved: derived, not weights


@dataclass
class SourceModel:
    """A transformers model directory, checked: it maps onto the reference transformer."""

    folder: Path
    origin: str  # the directory, or hf://OWNER/NAME@SHA
    hf_config: dict[str, Any]
    params: dict[str, Any]  # model: keys of reference_transformer
    names: dict[str, tuple[Path, str]] = field(default_factory=dict)  # ours -> (file, theirs)

    @property
    def tokenizer_path(self) -> Path | None:
        path = self.folder / "tokenizer.json"
        return path if path.is_file() else None

    def tokenizer_files(self) -> list[str]:
        return [name for name in TOKENIZER_FILES if (self.folder / name).is_file()]

    def model_section(self) -> dict[str, Any]:
        return {"name": "reference_transformer", **self.params}


def is_model_source(src: str | os.PathLike) -> bool:
    """Whether SRC names a transformers model (a Hub model or a directory with config.json)
    rather than a Speedtronic run."""
    text = str(src)
    if text.startswith(HUB_PREFIX):
        return True
    path = Path(text)
    return (path / "config.json").is_file() and not (path / "meta.json").is_file()


def parse_hub(src: str) -> tuple[str, str]:
    """``hf://OWNER/NAME[@REV]`` as (repo id, revision)."""
    from speedtronic.hub.names import is_hub_repo_id

    repo, _, revision = src.removeprefix(HUB_PREFIX).partition("@")
    if not is_hub_repo_id(repo) or src.startswith(f"{HUB_PREFIX}datasets/"):
        raise ConfigError(
            f"SRC: {src!r} is not a Hub model: use hf://OWNER/NAME or hf://OWNER/NAME@REVISION"
        )
    return repo, revision or "main"


def fetch(src: str, log=None) -> tuple[Path, str]:
    """SRC's local folder and how to name where it came from."""
    if not src.startswith(HUB_PREFIX):
        folder = Path(src)
        if not folder.is_dir():
            raise ConfigError(f"SRC: {src} is not a directory (a transformers model directory "
                              "or hf://OWNER/NAME[@REV])")  # fmt: skip
        return folder, str(folder)
    from platformdirs import user_cache_dir

    from speedtronic.hub.models import download_model

    repo, revision = parse_hub(src)
    cache = Path(user_cache_dir("speedtronic"), "hub", "models", repo.replace("/", "--"))
    endpoint = os.environ.get("HF_ENDPOINT") or None
    folder, sha, listed = download_model(repo, revision, cache, endpoint)
    if "config.json" not in listed:
        raise ConfigError(f"SRC: {src} holds no config.json at {sha[:12]}: not a transformers "
                          "model repo")  # fmt: skip
    if log is not None:
        log(f"{src}: commit {sha[:12]}, cached in {folder}")
    return folder, f"{HUB_PREFIX}{repo}@{sha}"


def open_source(src: str | os.PathLike, log=None) -> SourceModel:
    """SRC checked through and through, nothing loaded (see the module docstring)."""
    folder, origin = fetch(str(src), log)
    where = str(folder / "config.json")
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise ConfigError(f"SRC: cannot read {where}: {why}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"SRC: {where} is not a JSON object")
    params = hf_config.reference_params(config, where)
    source = SourceModel(folder, origin, config, params)
    source.names = _check_tensors(source, _weight_files(folder))
    return source


def _weight_files(folder: Path) -> list[Path]:
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"SRC: {index} is not a safetensors index ({exc})") from None
        bad = [n for n in names if not isinstance(n, str) or "/" in n or n.startswith(".")]
        if bad:
            raise ConfigError(f"SRC: {index} names a file outside its folder ({bad[0]!r})")
        return [folder / name for name in names]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    pickled = [p.name for p in sorted(folder.glob("*.bin")) + sorted(folder.glob("*.pt"))]
    why = f"only pickled weights ({pickled[0]}), which are never loaded" if pickled else "none"
    raise ConfigError(
        f"SRC: {folder} holds no safetensors weights (model.safetensors or {INDEX_FILE}): {why}",
        hint="convert it with transformers' save_pretrained(..., safe_serialization=True)",
    )


def _check_tensors(source: SourceModel, files: list[Path]) -> dict[str, tuple[Path, str]]:
    """Every tensor's reference name, checked against the model's shapes (headers only)."""
    from safetensors import safe_open

    expected = _shapes(source.params)
    names: dict[str, tuple[Path, str]] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    info = f.get_slice(key)
                    _check_one(path, key, info.get_shape(), info.get_dtype(), expected, names)
        except (OSError, Exception) as exc:  # safetensors raises its own error types
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"SRC: {path} is not a readable safetensors file ({exc})") from None
    tied = source.params["tie_embeddings"]
    missing = [k for k in expected if k not in names and not (tied and k == "lm_head.weight")]
    if missing:
        raise ConfigError(f"SRC: the weights lack {len(missing)} tensor(s) the config implies "
                          f"(e.g. {llama.llama_name(missing[0])}); nothing written")  # fmt: skip
    return names


def _check_one(path, key, shape, dtype, expected, names) -> None:
    ours = llama.reference_name(key)
    if ours is None and key.endswith(_IGNORED):
        return
    if ours is None or ours not in expected:
        raise ConfigError(f"SRC: {path.name}: tensor {key} has no place in the reference "
                          "transformer; nothing written")  # fmt: skip
    if list(shape) != expected[ours]:
        raise ConfigError(f"SRC: {path.name}: {key} is {list(shape)}, the config implies "
                          f"{expected[ours]}; nothing written")  # fmt: skip
    if dtype not in _DTYPES:
        raise ConfigError(f"SRC: {path.name}: {key} is {dtype}; import reads "
                          f"{', '.join(_DTYPES)} weights; nothing written")  # fmt: skip
    names[ours] = (path, key)


def _shapes(params: dict[str, Any]) -> dict[str, list[int]]:
    from speedtronic.model import ReferenceConfig, ReferenceTransformer

    with torch.device("meta"):
        model = ReferenceTransformer(ReferenceConfig(**params))
    return {k: list(v.shape) for k, v in model.state_dict().items()}


def load_state(source: SourceModel) -> dict[str, torch.Tensor]:
    """The weights under the reference transformer's names, each read once in its file's
    dtype; a tied head is the embedding itself (one tensor, stored once by a checkpoint)."""
    from safetensors import safe_open

    state: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[tuple[str, str]]] = {}
    tied = source.params["tie_embeddings"]
    for ours, (path, theirs) in source.names.items():
        if tied and ours == "lm_head.weight":  # a file may hold both: the embedding is the one
            continue
        by_file.setdefault(path, []).append((ours, theirs))
    for path, pairs in by_file.items():
        with safe_open(str(path), framework="pt") as f:
            for ours, theirs in pairs:
                state[ours] = f.get_tensor(theirs)
    if tied:
        state["lm_head.weight"] = state["tok_emb.weight"]
    return state

"""A transformers source's weights: which files, their headers checked, the tensors read.

``weight_names`` finds the safetensors files (one, or the shards an index names; never a
pickle), reads every tensor's name, shape and dtype from the headers alone and checks them
against the reference transformer the config describes: first the layer count, before a model
of that many layers is built even on the meta device, then every shape and dtype, then that no
tensor is missing. ``read_weights`` reads the tensors one at a time in their file's dtype and
refuses one that is not finite, naming it and its file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from speedtronic.errors import ConfigError, DataError
from speedtronic.modelout import llama
from speedtronic.readlimit import MIB, read_json

INDEX_FILE = "model.safetensors.index.json"
INDEX_LIMIT = 32 * MIB  # a 90k-tensor model's index is ~9 MB
_FINITE_SLICE = 1 << 24  # elements checked at once: a large tensor's check holds no copy of it
_DTYPES = ("F32", "BF16", "F16")
_IGNORED = ("rotary_emb.inv_freq",)  # buffers some old checkpoints saved: derived, not weights


def weight_names(folder: Path, params: dict[str, Any]) -> dict[str, tuple[Path, str]]:
    """Every tensor's reference name -> (its file, its name there), checked against the model
    ``params`` describe (headers only); a ConfigError naming the first misfit."""
    headers = _headers(_weight_files(folder))
    _check_layers(folder, params, headers)
    expected = _shapes(params)
    names: dict[str, tuple[Path, str]] = {}
    for path, key, shape, dtype in headers:
        _check_one(path, key, shape, dtype, expected, names)
    tied = params["tie_embeddings"]
    missing = [k for k in expected if k not in names and not (tied and k == "lm_head.weight")]
    if missing:
        raise ConfigError(f"SRC: the weights lack {len(missing)} tensor(s) the config implies "
                          f"(e.g. {llama.llama_name(missing[0])}); nothing written")  # fmt: skip
    return names


def _weight_files(folder: Path) -> list[Path]:
    index = folder / INDEX_FILE
    if index.is_file():
        doc = read_json(index, INDEX_LIMIT, "SRC", ConfigError)
        try:
            names = sorted(set(doc["weight_map"].values()))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"SRC: {index} is not a safetensors index ({exc})") from None
        bad = [n for n in names if not isinstance(n, str) or "/" in n or n.startswith(".")]
        if bad:
            raise ConfigError(f"SRC: {index} names a file outside its folder ({bad[0]!r})")
        absent = [n for n in names if not (folder / n).is_file()]  # a FIFO would hang the read
        if absent:
            raise ConfigError(f"SRC: {index} names {absent[0]}, which is not a file in {folder}")
        return [folder / name for name in names]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    pickled = [p.name for p in sorted(folder.glob("*.bin")) + sorted(folder.glob("*.pt"))]
    why = f"only pickled weights ({pickled[0]}), which are never loaded" if pickled else "none"
    raise ConfigError(
        f"SRC: {folder} holds no safetensors weights (model.safetensors or {INDEX_FILE}): {why}",
        hint="convert it with transformers' save_pretrained(..., safe_serialization=True)",
    )


def _headers(files: list[Path]) -> list[tuple[Path, str, list[int], str]]:
    """(file, name, shape, dtype) of every tensor, from the safetensors headers alone."""
    from safetensors import safe_open

    found = []
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    info = f.get_slice(key)
                    found.append((path, key, info.get_shape(), info.get_dtype()))
        except Exception as exc:  # safetensors raises its own error types
            raise ConfigError(f"SRC: {path} is not a readable safetensors file ({exc})") from None
    return found


def _check_layers(folder: Path, params: dict[str, Any], headers: list) -> None:
    """config.json's layer count against the layers the weights hold, before a model of that
    many layers is built (10 million layers took minutes and gigabytes on the meta device)."""
    held = {llama.layer_index(key) for _, key, _, _ in headers} - {None}
    count = params["n_layer"]
    if held != set(range(count)):
        span = f" (model.layers.{min(held)} to {max(held)})" if held else ""
        raise ConfigError(
            f"SRC: {folder / 'config.json'}: num_hidden_layers: {count}, but the weights hold "
            f"{len(held)} layers{span}; nothing written"
        )


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


def read_weights(names: dict[str, tuple[Path, str]], tied: bool) -> dict[str, torch.Tensor]:
    """The tensors ``names`` lists under the reference transformer's names, each read once in
    its file's dtype and refused unless finite; a tied head is the embedding itself (one
    tensor, stored once by a checkpoint)."""
    from safetensors import safe_open

    state: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[tuple[str, str]]] = {}
    for ours, (path, theirs) in names.items():
        if tied and ours == "lm_head.weight":  # a file may hold both: the embedding is the one
            continue
        by_file.setdefault(path, []).append((ours, theirs))
    for path, pairs in by_file.items():
        with safe_open(str(path), framework="pt") as f:
            for ours, theirs in pairs:
                state[ours] = _finite(f.get_tensor(theirs), path, theirs)
    if tied:
        state["lm_head.weight"] = state["tok_emb.weight"]
    return state


def _finite(tensor: torch.Tensor, path: Path, key: str) -> torch.Tensor:
    """``tensor``, if every value is finite (checked in slices: no full-size mask)."""
    for part in tensor.reshape(-1).split(_FINITE_SLICE):
        if not bool(torch.isfinite(part).all()):
            what = "NaN" if bool(torch.isnan(part).any()) else "an infinity"
            raise DataError(
                f"SRC: {path}: tensor {key} holds {what}: its values are not finite (damaged "
                "weights); nothing written"
            )
    return tensor

"""A pretrained transformers model as the reference transformer: where it is, its keys, its weights.

SRC is a local transformers directory (``config.json`` + safetensors weights, one file or
shards with ``model.safetensors.index.json``) or ``hf://OWNER/NAME[@REV]``, downloaded through
the project's one Hub client (``speedtronic.hub.models.download_model``) into the user cache
at its commit, so the same revision is fetched once. Pickled weights are never read: a
directory holding only ``pytorch_model.bin`` is refused. ``open_source`` reads what decides
whether it maps and the values a run's config allows (``hf_config``), the tensors' names,
shapes and dtypes from the safetensors headers alone (the layer count against them before a
model of that many layers is built, even on the meta device) and the tokenizer files (no more
ids than the model's vocabulary; their special tokens kept with it), and refuses any mismatch
before anything is loaded or written; every file read whole is read with a bound
(``readlimit``). ``load_state`` then reads the tensors one at a time under the reference
transformer's names (one copy in memory, in the file's dtype), each refused unless finite.
Both ``speedtronic import`` and ``train --init-from`` use it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedtronic.errors import ConfigError
from speedtronic.modelout import hf_config
from speedtronic.modelout.source_weights import read_weights, weight_names
from speedtronic.readlimit import MIB, read_bytes, read_text

HUB_PREFIX = "hf://"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)
# Bounds of the files read whole: a large vocabulary's tokenizer.json (Gemma's 262k ids) is
# ~33 MB; the rest are a few KB.
LIMITS = {"config.json": 4 * MIB, "tokenizer.json": 64 * MIB, "tokenizer_config.json": 16 * MIB}
OTHER_LIMIT = 4 * MIB


@dataclass
class SourceModel:
    """A transformers model directory, checked: it maps onto the reference transformer."""

    folder: Path
    origin: str  # the directory, or hf://OWNER/NAME@SHA
    hf_config: dict[str, Any]
    params: dict[str, Any]  # model: keys of reference_transformer
    names: dict[str, tuple[Path, str]] = field(default_factory=dict)  # ours -> (file, theirs)
    tokenizer_data: dict[str, bytes] = field(default_factory=dict)  # the files, as read once
    tokenizer: Any = None  # an HFTokenizer of tokenizer.json, when there is one

    @property
    def tokenizer_path(self) -> Path | None:
        return self.folder / "tokenizer.json" if self.tokenizer is not None else None

    def tokenizer_files(self) -> list[str]:
        return list(self.tokenizer_data)

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
    where = folder / "config.json"
    text = read_text(where, LIMITS["config.json"], "SRC", ConfigError)
    try:  # NaN and Infinity are read here, to be refused by hf_config naming their key
        config = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"SRC: {where} is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"SRC: {where} is not a JSON object")
    params = hf_config.reference_params(config, str(where))
    source = SourceModel(folder, origin, config, params)
    source.names = weight_names(folder, params)
    _read_tokenizer(source)
    return source


def load_state(source: SourceModel) -> dict[str, Any]:
    """SRC's weights under the reference transformer's names (``source_weights.read_weights``)."""
    return read_weights(source.names, bool(source.params["tie_embeddings"]))


def _read_tokenizer(source: SourceModel) -> None:
    """The tokenizer files, each read once with a bound; tokenizer.json may not hold more ids
    than the model embeds."""
    for name in TOKENIZER_FILES:
        path = source.folder / name
        if os.path.lexists(path):  # a link to a device is refused, not skipped
            limit = LIMITS.get(name, OTHER_LIMIT)
            source.tokenizer_data[name] = read_bytes(path, limit, "SRC", ConfigError)
    data = source.tokenizer_data.get("tokenizer.json")
    if data is None:
        return
    from speedtronic.data.tokenizer import HFTokenizer
    from speedtronic.modelout.tokenizer_files import read_specials

    source.tokenizer = HFTokenizer(source.folder / "tokenizer.json", data)
    # recorded with the tokenizer, so an export (of this or a run from it) writes them back
    source.tokenizer.specials = read_specials(source.tokenizer_data, source.hf_config) or None
    ids, vocab = source.tokenizer.vocab_size, source.params["vocab_size"]
    if ids > vocab:
        raise ConfigError(
            f"SRC: {source.folder / 'tokenizer.json'} has {ids} ids, more than the model's "
            f"vocabulary (config.json vocab_size: {vocab}): ids >= {vocab} cannot be embedded; "
            "nothing written"
        )
    _check_specials(source)


def _check_specials(source: SourceModel) -> None:
    """Refuse an id outside the model's vocabulary or a special token the tokenizer lacks in
    what the import keeps (issue 55 item 4), naming the file and key that state it."""
    from speedtronic.modelout.tokenizer_files import ADDITIONAL, specials_problem, stated

    specials = source.tokenizer.specials or {}
    problem = specials_problem(specials, source.tokenizer, source.params["vocab_size"])
    if problem is None:
        return
    path, value, why = problem
    ids_files = {"config_ids": "config.json", "generation_ids": "generation_config.json"}
    if path[0] in ids_files:
        name, key = ids_files[path[0]], path[1]
    else:  # the file a special token comes from, as read_specials took it
        said = stated(source.tokenizer_data)
        extra = path[0] == ADDITIONAL and not said.get(ADDITIONAL, ("", None))[1]
        key = "extra_special_tokens" if extra else path[0]
        name = said[key][0]
    raise ConfigError(f"SRC: {source.folder / name}: {key} {value!r} {why}; nothing written")

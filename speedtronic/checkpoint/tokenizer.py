"""How a checkpoint remembers the tokenizer its run's data was tokenized with. Torch-free.

Every checkpoint's meta.json carries a ``tokenizer`` record (docs/checkpoints.md), written from
the run's ``Runtime.tokenizer`` (``data.loader.run_tokenizer``):

- ``{"kind": "byte", "vocab_size": 256}``: UTF-8 bytes are the ids;
- ``{"kind": "tokenizers", "file": "tokenizer.json", "vocab_size": N, "sha256": ...}``: a
  Hugging Face tokenizers file, whose copy lies in the checkpoint directory (and is listed,
  with its size and hash, in meta.json's ``files``, so ``ckpt inspect --verify`` checks it);
- ``null``: the run's tokenizer is not known (a custom callable, token files naming none).

``tokenizer_from_record`` reads it back for ``speedtronic generate`` and ``export``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from speedtronic.checkpoint.layout import TOKENIZER_FILE
from speedtronic.data.tokenizer import ByteTokenizer, HFTokenizer
from speedtronic.errors import CheckpointError

BYTE_KIND, FILE_KIND = "byte", "tokenizers"


def tokenizer_record(tokenizer: Any) -> tuple[dict | None, bytes | None]:
    """``(meta.json record, file bytes to keep beside the weights)`` for a run's tokenizer;
    ``(None, None)`` when it is neither byte-level nor a tokenizers file (unknown)."""
    if isinstance(tokenizer, ByteTokenizer):
        return {"kind": BYTE_KIND, "vocab_size": ByteTokenizer.vocab_size}, None
    if isinstance(tokenizer, HFTokenizer):
        record = {
            "kind": FILE_KIND,
            "file": TOKENIZER_FILE,
            "vocab_size": tokenizer.vocab_size,
            "sha256": hashlib.sha256(tokenizer.data).hexdigest(),
        }
        return record, tokenizer.data
    return None, None


def tokenizer_from_record(meta: dict, checkpoint_dir: Path, where: str) -> Any:
    """The tokenizer a checkpoint records, or None when the run's tokenizer is unknown.

    A checkpoint written before the record existed has no ``tokenizer`` key: its stored config
    decides (``data.tokenizer: byte`` with text or synthetic data is byte-level), else None.
    A record that names a file the directory does not hold, holds other bytes than it records
    or is of a kind this version does not know is a CheckpointError naming ``where``.
    """
    if "tokenizer" not in meta:
        return _from_config(meta.get("config"))
    record = meta["tokenizer"]
    if record is None:
        return None
    kind = record.get("kind") if isinstance(record, dict) else None
    if kind == BYTE_KIND:
        return ByteTokenizer()
    if kind != FILE_KIND or record.get("file") != TOKENIZER_FILE:
        raise CheckpointError(f"{where}: meta.json's tokenizer record is of a kind unknown here")
    path = checkpoint_dir / TOKENIZER_FILE
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(
            f"{where}: meta.json records a tokenizer file but {path} cannot be read "
            f"({exc.strerror or exc})"
        ) from None
    if hashlib.sha256(data).hexdigest() != record.get("sha256"):
        raise CheckpointError(f"{where}: {path} is not the tokenizer meta.json records (sha256)")
    return HFTokenizer(path, data)


def _from_config(config: Any) -> Any:
    """Before the record: byte-level if the stored config says so for text or synthetic data."""
    data = config.get("data") if isinstance(config, dict) else None
    if not isinstance(data, dict) or data.get("tokenizer", "byte") != "byte":
        return None
    source = data.get("source", "auto")
    if source == "auto":
        source = "tokens" if data.get("token_path") and not data.get("text_path") else "text"
    return ByteTokenizer() if source != "tokens" else None

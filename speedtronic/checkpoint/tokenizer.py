"""How a checkpoint remembers the tokenizer its run's data was tokenized with. Torch-free.

Every checkpoint's meta.json carries a ``tokenizer`` record (docs/checkpoints.md), written from
the run's ``Runtime.tokenizer`` (``data.loader.run_tokenizer``):

- ``{"kind": "byte", "vocab_size": 256}``: UTF-8 bytes are the ids;
- ``{"kind": "tokenizers", "file": "tokenizer.json", "vocab_size": N, "sha256": ...,
  "identity": ...}``: a Hugging Face tokenizers file, whose copy lies in the checkpoint
  directory (and is listed, with its size and hash, in meta.json's ``files``, so ``ckpt
  inspect --verify`` checks it); ``identity`` is what it does to text
  (``data.tokenizer.tokenizer_identity``), the same for the same tokenizer saved otherwise;
- ``null``: the run's tokenizer is not known (a custom callable, token files naming none).

A tokenizers record may carry ``specials``: what transformers' files said around the
tokenizer when it came with a model (``speedtronic import``): the special tokens, the chat
template and config.json's and generation_config.json's token ids (``modelout.tokenizer_files``).
A run started ``--init-from`` such a model on data of the same tokenizer records them again, so
``export`` writes them back (issue 48). ``tokenizer_from_record`` reads it back for
``speedtronic generate`` and ``export``; ``describe`` names a record for people.
``same_tokenizer`` is the one comparison of two records (``train --init-from``'s guard, ``runs
compare``): the same kind and, for a file, the same identity (or, for a record written before
identities, the same bytes). The specials are not part of it: they name tokens, not ids.
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
            "identity": tokenizer.identity,
        }
        if tokenizer.specials:
            record["specials"] = tokenizer.specials
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
    tokenizer = HFTokenizer(path, data)
    specials = record.get("specials")
    tokenizer.specials = specials if isinstance(specials, dict) else None
    return tokenizer


def same_tokenizer(a: dict, b: dict) -> bool:
    """Whether two records name the same ids: both bytes, the same tokenizer.json bytes, or
    files of one identity. Where either record predates identities and the bytes differ,
    they are not known to be the same."""
    if a.get("kind") != b.get("kind"):
        return False
    if a.get("kind") == BYTE_KIND:
        return True
    if a.get("sha256") and a.get("sha256") == b.get("sha256"):
        return True
    if a.get("identity") or b.get("identity"):
        return a.get("identity") == b.get("identity")
    plain = [{k: v for k, v in r.items() if k != "specials"} for r in (a, b)]
    return plain[0] == plain[1]  # a kind unknown here: the records themselves


def describe(record: dict | None) -> str:
    """A record in a few words: ``bytes (256 ids)`` or the file's hash, size and specials."""
    if not isinstance(record, dict):
        return "no known tokenizer"
    if record.get("kind") == BYTE_KIND:
        return "bytes (UTF-8, 256 ids)"
    text = f"tokenizer.json sha256 {str(record.get('sha256'))[:12]} ({record.get('vocab_size')} ids"
    specials = record.get("specials") if isinstance(record.get("specials"), dict) else {}
    named = [f"{k[:3]} {specials[k]}" for k in ("bos_token", "eos_token") if specials.get(k)]
    return text + "".join(f", {n}" for n in named) + ")"


def _from_config(config: Any) -> Any:
    """Before the record: byte-level if the stored config says so for text or synthetic data."""
    data = config.get("data") if isinstance(config, dict) else None
    if not isinstance(data, dict) or data.get("tokenizer", "byte") != "byte":
        return None
    source = data.get("source", "auto")
    if source == "auto":
        source = "tokens" if data.get("token_path") and not data.get("text_path") else "text"
    return ByteTokenizer() if source != "tokens" else None

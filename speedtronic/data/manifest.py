"""A token-shard folder's manifest, and the tokenizer a run's data was tokenized with.

``speedtronic data tokenize`` writes ``manifest.json`` last into its output folder: the format
and version, the dtype and vocabulary, the tokenizer (``kind`` byte or tokenizers, its source,
sha256; the folder keeps a copy as ``tokenizer.json``), the document separator, the held-out
rule, every shard per part (``train``, ``val``: file, tokens, sha256, and ``bytes``: the UTF-8
bytes of the text its tokens came from, separators excluded; absent in folders written before
it was counted), every source (name, size, sha256, documents, tokens) and the counts. A folder
without it is not a finished tokenize. A chat folder (``--chat``) adds ``chat``: its template
(``chat_template.jinja``, sha256, where it came from), special tokens, ``seq_len``,
``train_on`` and ``masking``; each shard record its loss mask (``mask``, ``mask_sha256``),
which ``shards`` checks is there at one byte a token.

``read_manifest`` checks it and that each shard is there at its recorded size; ``shards``
lists a part's files, ``text_bytes`` their bytes of text where recorded (bits per byte).
``data_tokenizer(config)`` is what the runtime records in a checkpoint as the run's tokenizer
(``runtime.tokenizer``): for ``data.token_path`` naming a shard folder, the manifest's
tokenizer (``ByteTokenizer``, or an ``HFTokenizer`` whose ``.path`` is the folder's
``tokenizer.json``); for a flat token file, None (unknown: a flat file does not say); for a text
source, ``data.tokenizer`` loaded; for synthetic data, None. Stdlib only (no torch).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from speedtronic.errors import DataError

MANIFEST = "manifest.json"
FORMAT = "speedtronic.tokens"
VERSION = 1
ITEMSIZE = {"uint16": 2, "uint32": 4}
SPLIT_RULE = "blake2b-64 of the document's UTF-8 text < val_fraction * 2**64"


def build(plan: dict, parts: dict[str, list[dict]], sources: list[dict], counts: dict) -> dict:
    request = plan["request"]
    return {
        "format": FORMAT,
        "version": VERSION,
        "dtype": plan["dtype"],
        "vocab_size": plan["tokenizer"]["vocab_size"],
        "tokenizer": plan["tokenizer"],
        "separator": plan["separator"],
        "column": request["column"],
        "val_fraction": request["val_fraction"],
        "split_rule": SPLIT_RULE,
        "max_tokens": request["max_tokens"],
        "parts": parts,
        "sources": sources,
        "counts": counts,
        "plan": plan,
        **({"chat": plan["chat"]} if plan.get("chat") else {}),
    }


def is_shard_dir(path: str | Path) -> bool:
    return Path(path).is_dir()


def read_manifest(folder: str | Path, key: str) -> dict:
    """The manifest of ``folder``, checked (format, dtype, parts, each shard's size)."""
    folder = Path(folder)
    path = folder / MANIFEST
    partial = folder.with_name(folder.name + ".partial")
    if not path.is_file():
        hint = f"; {partial} holds an unfinished one: rerun its command" if partial.exists() else ""
        raise DataError(
            f"{key}: {folder} is a folder without {MANIFEST}, so not a finished "
            f"'speedtronic data tokenize' output{hint}"
        )
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{key}: {path} is not readable JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise DataError(f"{key}: {path} is not a speedtronic token manifest")
    if doc.get("version") != VERSION:
        raise DataError(
            f"{key}: {path} has version {doc.get('version')!r}; this build reads {VERSION}"
        )
    if doc.get("dtype") not in ITEMSIZE or not isinstance(doc.get("parts"), dict):
        raise DataError(f"{key}: {path} names no valid dtype or parts")
    for part in doc["parts"]:
        for _path, _tokens in shards(folder, doc, part, key):
            pass
    return doc


def shards(folder: str | Path, doc: dict, part: str, key: str) -> list[tuple[Path, int]]:
    """``(path, tokens)`` of each shard of ``part``, each checked to be there at its size."""
    folder, out = Path(folder), []
    for record in doc["parts"].get(part) or []:
        name, tokens = record.get("file"), record.get("tokens")
        if (
            not isinstance(name, str)
            or "/" in name
            or name.startswith(".")
            or not isinstance(tokens, int)
        ):
            raise DataError(f"{key}: {folder / MANIFEST} lists a bad shard {record!r}")
        path = folder / name
        size = tokens * ITEMSIZE[doc["dtype"]]
        if not path.is_file() or path.stat().st_size != size:
            found = f"{path.stat().st_size} bytes" if path.is_file() else "missing"
            raise DataError(
                f"{key}: shard {path} is {found}, the manifest says {size} bytes; the folder is "
                "damaged: tokenize again"
            )
        mask = record.get("mask")
        if doc.get("chat") and (
            not isinstance(mask, str)
            or mask != name[: -len(".bin")] + ".mask"
            or not (folder / mask).is_file()
            or (folder / mask).stat().st_size != tokens
        ):
            raise DataError(
                f"{key}: the loss mask of shard {path} is missing or not {tokens} bytes; the "
                "folder is damaged: tokenize again"
            )
        out.append((path, tokens))
    return out


def text_bytes(doc: dict, part: str) -> list[int] | None:
    """Each shard of ``part``'s UTF-8 bytes of text, in order; None unless every one says."""
    found = [record.get("bytes") for record in doc["parts"].get(part) or []]
    if not found or not all(isinstance(n, int) and n >= 0 for n in found):
        return None  # an older folder (or a damaged record): its bits per byte are unknown
    return found


def summary(doc: dict) -> dict:
    """What a checked manifest holds, for people: tokens, shards, bytes, dtype, tokenizer."""
    records = [r for part in doc["parts"].values() for r in part or []]
    tokens = sum(r["tokens"] for r in records)
    tokenizer = doc.get("tokenizer") if isinstance(doc.get("tokenizer"), dict) else {}
    return {
        "tokens": tokens,
        "shards": len(records),
        "parts": {
            name: sum(r["tokens"] for r in part or []) for name, part in doc["parts"].items()
        },
        "dtype": doc["dtype"],
        "bytes": tokens * ITEMSIZE[doc["dtype"]],
        "tokenizer": {k: tokenizer.get(k) for k in ("kind", "source", "vocab_size", "sha256")},
    }


def tokenizer_of(folder: str | Path, doc: dict) -> Any:
    """The manifest's tokenizer as an object (``ByteTokenizer`` or ``HFTokenizer``)."""
    from speedtronic.data.tokenizer import ByteTokenizer, HFTokenizer

    record = doc["tokenizer"]
    if record.get("kind") == "byte":
        return ByteTokenizer()
    name = record.get("file", "tokenizer.json")
    if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
        raise DataError(f"{Path(folder) / MANIFEST} names a bad tokenizer file {name!r}")
    path = Path(folder) / name
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path} cannot be read ({exc.strerror or exc})") from None
    if hashlib.sha256(data).hexdigest() != record.get("sha256"):
        raise DataError(  # what a checkpoint records and generate decodes with: never a swap
            f"{path} is not the tokenizer {Path(folder) / MANIFEST} records (sha256): restore "
            "it or tokenize again"
        )
    return HFTokenizer(path, data)


def data_tokenizer(config: Any) -> Any:
    """The tokenizer ``config``'s training data was tokenized with, or None when unknown."""
    data = config.data
    source = data.resolved_source
    if source == "tokens":
        if is_shard_dir(data.token_path):
            return tokenizer_of(data.token_path, read_manifest(data.token_path, "data.token_path"))
        return None
    if source == "text":
        from speedtronic.data.tokenizer import load_tokenizer

        return load_tokenizer(data.tokenizer)
    return None

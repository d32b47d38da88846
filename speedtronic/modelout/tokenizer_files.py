"""The tokenizer files of an export: ``tokenizer.json`` and ``tokenizer_config.json``. Stdlib only.

``AutoTokenizer.from_pretrained`` must give the ids the model was trained on. A byte-level run
gets a ``tokenizer.json`` written here: a BPE with no merges over GPT-2's byte-to-character
table, whose ids are the UTF-8 bytes themselves (``tokenizers`` and transformers 4.57 and 5
encode and decode it exactly). A tokenizers-file run ships its own file, minus a
post-processor that adds special tokens (e.g. a BOS template): Speedtronic tokenizes without
them, so transformers must too. ``tokenizer_config.json`` names the fast tokenizer class
(without it, 4.57 picks a Llama tokenizer that adds a BOS) and no BOS/EOS.
"""

from __future__ import annotations

import json
from typing import Any

from speedtronic.data.tokenizer import ByteTokenizer, HFTokenizer
from speedtronic.errors import DataError

# post-processors whose job is adding special tokens around the text
_ADDING = {"TemplateProcessing", "BertProcessing", "RobertaProcessing"}


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's table: each byte a printable character (what the ByteLevel pre-tokenizer uses)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b], extra = chr(256 + extra), extra + 1
    return table


def byte_tokenizer_json() -> dict[str, Any]:
    """A tokenizers document whose ids are the UTF-8 bytes of the text, and back."""
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False}
    level["use_regex"] = False
    table = byte_to_unicode()
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": level,
        "post_processor": None,
        "decoder": level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {table[b]: b for b in range(256)},
            "merges": [],
        },
    }


def without_added_specials(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with no post-processor that adds special tokens (others are kept)."""
    processor = document.get("post_processor")
    if isinstance(processor, dict) and processor.get("type") in _ADDING:
        processor = None
    elif isinstance(processor, dict) and processor.get("type") == "Sequence":
        kept = [p for p in processor.get("processors", []) if p.get("type") not in _ADDING]
        processor = {**processor, "processors": kept} if kept else None
    return {**document, "post_processor": processor}


def tokenizer_files(tokenizer: Any, max_length: int) -> dict[str, bytes]:
    """``{"tokenizer.json": ..., "tokenizer_config.json": ...}`` for the run's tokenizer."""
    if isinstance(tokenizer, ByteTokenizer):
        document = byte_tokenizer_json()
    elif isinstance(tokenizer, HFTokenizer):
        try:
            document = without_added_specials(json.loads(tokenizer.data))
        except (ValueError, RecursionError) as exc:
            raise DataError(f"{tokenizer.path}: not a tokenizers JSON file ({exc})") from None
    else:
        raise DataError(f"export: cannot write a {type(tokenizer).__name__} for transformers")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": None,
        "eos_token": None,
        "clean_up_tokenization_spaces": False,
    }
    return {
        "tokenizer.json": json.dumps(document, ensure_ascii=False).encode("utf-8"),
        "tokenizer_config.json": (json.dumps(config, indent=2) + "\n").encode(),
    }

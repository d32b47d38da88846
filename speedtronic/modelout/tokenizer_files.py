"""The tokenizer files of an export (``tokenizer.json``, ``tokenizer_config.json``), and the
special tokens an import keeps for them. Stdlib only.

``AutoTokenizer.from_pretrained`` must give the ids the model was trained on. A byte-level run
gets a ``tokenizer.json`` written here: a BPE with no merges over GPT-2's byte-to-character
table, whose ids are the UTF-8 bytes themselves (``tokenizers`` and transformers 4.57 and 5
encode and decode it exactly). A tokenizers-file run ships its own file, minus a
post-processor that adds special tokens (e.g. a BOS template): Speedtronic tokenizes without
them, so transformers must too. ``tokenizer_config.json`` names the fast tokenizer class
(without it, 4.57 picks a Llama tokenizer that adds a BOS) and adds no BOS/EOS.

Issue 48: an export had ``eos_token`` null (transformers' ``generate`` never stopped at the end
of a document) and lost the chat template. ``read_specials`` keeps, at import, what the model's
files say around ``tokenizer.json`` (the special tokens, the chat template, config.json's and
generation_config.json's token ids); the checkpoint records it (``checkpoint.tokenizer``) and
``tokenizer_files`` / ``token_ids`` write it back. A run without that record names its
tokenizer file's own special tokens (``data tokenizer train``'s): its end-of-document token as
EOS, a template's BOS as BOS, the rest as additional; only tokens the file already adds as
special, so transformers' ids stay the run's.

Issue 55 item 4: an import kept ``eos_token_id: 99999`` for a 300-row vocabulary and special
tokens its tokenizer lacked (transformers then adds them as new ids: an export with 513 tokens
for a 512-row embedding). ``specials_problem`` finds the first such id or token in what is
kept; import refuses it naming the file and key, export naming meta.json's key.
"""

from __future__ import annotations

import json
from typing import Any

from speedtronic.data.tokenizer import ByteTokenizer, HFTokenizer
from speedtronic.errors import ConfigError, DataError

# post-processors whose job is adding special tokens around the text
_ADDING = {"TemplateProcessing", "BertProcessing", "RobertaProcessing"}
TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")
ADDITIONAL = "additional_special_tokens"
ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def read_specials(files: dict[str, bytes], hf_config: dict[str, Any]) -> dict[str, Any]:
    """What a transformers model says around its ``tokenizer.json`` (``files``: its tokenizer
    files as read): special tokens, chat template, config.json's and generation_config.json's
    token ids; only what it states."""
    found = {key: value for key, (_, value) in stated(files).items()}
    out: dict[str, Any] = {k: _content(found[k]) for k in TOKEN_KEYS if _content(found.get(k))}
    extra = found.get(ADDITIONAL) or found.get("extra_special_tokens")  # transformers 4, 5
    if isinstance(extra, list) and [_content(t) for t in extra if _content(t)]:
        out[ADDITIONAL] = [_content(t) for t in extra if _content(t)]
    template = files.get("chat_template.jinja")
    template = template.decode("utf-8", "replace") if template else found.get("chat_template")
    if template:
        out["chat_template"] = template
    generation = _json(files, "generation_config.json")
    for key, where in [("config_ids", hf_config), ("generation_ids", generation)]:
        ids = {k: where[k] for k in ID_KEYS if where.get(k) is not None}
        if ids:
            out[key] = ids
    return out


def stated(files: dict[str, bytes]) -> dict[str, tuple[str, Any]]:
    """Each key the special-token files state -> (the file that states it, its value):
    tokenizer_config.json's word over special_tokens_map.json's, as transformers reads them."""
    out: dict[str, tuple[str, Any]] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        out.update({key: (name, value) for key, value in _json(files, name).items()})
    return out


def specials_problem(
    specials: dict, tokenizer: Any, vocab: int
) -> tuple[list[str], Any, str] | None:
    """The first id or token of ``specials`` (``read_specials``' keys) that cannot be kept, as
    (its key path, its value, why); None when all can: an id must be one of the
    model's ``vocab`` rows, a special token one ``tokenizer`` has (else transformers adds it
    as an id beyond them)."""
    for group in ("config_ids", "generation_ids"):
        for key, value in (specials.get(group) or {}).items():
            for token in value if isinstance(value, list) else [value]:
                if type(token) is not int or not 0 <= token < vocab:
                    why = f"is not an id of the model's vocabulary ({vocab} ids: 0 to {vocab - 1})"
                    return [group, key], token, why
    named = [(k, specials[k]) for k in TOKEN_KEYS if k in specials]
    named += [(ADDITIONAL, t) for t in specials.get(ADDITIONAL) or []]
    for key, token in named:
        if not isinstance(token, str) or tokenizer.token_id(token) is None:
            why = "is not a token of tokenizer.json (transformers would add it as a new id)"
            return [key], token, why
    return None


def _json(files: dict[str, bytes], name: str) -> dict[str, Any]:
    if name not in files:
        return {}
    try:
        doc = json.loads(files[name])
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"SRC: {name} is not valid JSON ({exc}); nothing written") from None
    return doc if isinstance(doc, dict) else {}


def _content(token: Any) -> str | None:
    """A special token as transformers writes it: its text, or an AddedToken's mapping."""
    token = token.get("content") if isinstance(token, dict) else token
    return token if isinstance(token, str) and token else None


def special_tokens(tokenizer: Any, eos: list[int], bos: int | None) -> dict[str, Any]:
    """The special tokens and chat template ``tokenizer_config.json`` names (see the module
    docstring): the recorded ones, else the file's own specials among ``eos`` and ``bos``."""
    recorded = getattr(tokenizer, "specials", None)
    if recorded or not isinstance(tokenizer, HFTokenizer):
        keys = (*TOKEN_KEYS, ADDITIONAL, "chat_template")
        return {k: recorded[k] for k in keys if k in recorded} if recorded else {}
    added = json.loads(tokenizer.data).get("added_tokens") or []
    named = {t.get("id"): _content(t) for t in added if t.get("special") and _content(t)}
    out: dict[str, Any] = {}
    if bos in named:
        out["bos_token"] = named[bos]
    for token in eos:
        if token in named:
            out["eos_token"] = named[token]
            break
    others = [t for i, t in sorted(named.items()) if t not in out.values()]
    return {**out, ADDITIONAL: others} if others else out


def token_ids(tokenizer: Any, found: dict[str, Any]) -> tuple[dict, dict]:
    """config.json's and generation_config.json's token ids: ``found`` (where generate stops),
    with what the import recorded in their place."""
    recorded = getattr(tokenizer, "specials", None) or {}
    config, generation = recorded.get("config_ids") or {}, recorded.get("generation_ids") or {}
    return {**found, **config}, {**found, **generation}


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


def tokenizer_files(tokenizer: Any, max_length: int, specials: dict | None = None) -> dict:
    """``{"tokenizer.json": ..., "tokenizer_config.json": ...}`` for the run's tokenizer;
    ``specials``: the special tokens and chat template to name (``special_tokens``)."""
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
        **(specials or {}),
    }
    return {
        "tokenizer.json": json.dumps(document, ensure_ascii=False).encode("utf-8"),
        "tokenizer_config.json": (json.dumps(config, indent=2) + "\n").encode(),
    }

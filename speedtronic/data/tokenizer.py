"""Tokenizers for text sources: the byte-level default and Hugging Face ``tokenizers`` files.

A tokenizer here is any callable ``str -> list[int]`` with an optional ``vocab_size``
attribute; the two shipped ones also ``decode`` ids back to text, for generation.
``load_tokenizer`` resolves the ``data.tokenizer`` setting; ``check_vocab`` makes sure the model
can embed every id the tokenizer produces. ``tokenizer_identity`` is the one answer to "are two
tokenizers files the same tokenizer" (issue 53 item 9). How a checkpoint remembers the run's
tokenizer is ``speedtronic.checkpoint.tokenizer``'s.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

from speedtronic.data.decoding import ByteStream, TokenizersStream
from speedtronic.errors import ConfigError, DataError
from speedtronic.readlimit import MIB, read_bytes

MAX_TOKENIZER_BYTES = 64 * MIB  # a 262k-id vocabulary's tokenizer.json is ~33 MB

Tokenizer = Callable[[str], list[int]]


class ByteTokenizer:
    """UTF-8 bytes as tokens (vocab 256): no merges, so any split of the text is safe."""

    vocab_size = 256
    name = "byte"

    def __call__(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        """Bytes back to text; a sequence cut inside a character shows as U+FFFD."""
        return bytes(ids).decode("utf-8", errors="replace")

    def decode_stream(self, prefix: list[int]) -> ByteStream:
        """For ids arriving one at a time after ``prefix`` (``data.decoding``)."""
        return ByteStream(prefix)


class HFTokenizer:
    """A Hugging Face ``tokenizers`` JSON file (``tokenizer.json``), without special tokens.

    ``path`` is the file it was read from and ``data`` the exact bytes it was built from,
    which is what a checkpoint keeps a copy of (a file edited later changes neither).
    """

    def __init__(self, path: str | Path, data: bytes | None = None):
        try:
            from tokenizers import Tokenizer as HFTokenizerImpl
        except ImportError:
            raise ConfigError(
                "data.tokenizer: a tokenizer file needs the 'tokenizers' package",
                hint="pip install 'speedtronic[tokenizers]'",
            ) from None
        path = Path(path)
        if data is None:
            if not path.exists():
                raise DataError(f"data.tokenizer: file not found: {path} (or use 'byte')")
            data = read_bytes(path, MAX_TOKENIZER_BYTES, "data.tokenizer:")
        try:
            self._impl = HFTokenizerImpl.from_str(data.decode("utf-8"))
        except Exception as exc:  # the Rust side raises a generic Exception for bad JSON
            raise DataError(
                f"data.tokenizer: {path} is not a tokenizers JSON file: {exc}"
            ) from None
        self.vocab_size = self._impl.get_vocab_size(with_added_tokens=True)
        self.name, self.path, self.data = str(path), path, data
        # transformers' special tokens and token ids around this file, when it came with a
        # model (checkpoint.tokenizer's "specials"): what export writes back
        self.specials: dict | None = None

    @cached_property
    def identity(self) -> str:
        return tokenizer_identity(self.data)

    def __call__(self, text: str) -> list[int]:
        return self._impl.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._impl.decode(ids, skip_special_tokens=False)

    def token_id(self, token: str) -> int | None:
        """The id of ``token`` (a vocabulary entry or an added token), None if it has none."""
        return self._impl.token_to_id(token)

    def decode_stream(self, prefix: list[int]) -> TokenizersStream:
        """For ids arriving one at a time after ``prefix``, which decides e.g. whether a word
        starts with a space (``data.decoding``)."""
        return TokenizersStream(self.decode, self._impl, prefix)


# What never changes an id: the decoder (ids back to text) and the format's version.
_NOT_IDENTITY = ("version", "decoder")
# Model flags that newer tokenizers versions write with their default (False) where older ones
# wrote nothing: absent and False are the same tokenizer.
_DEFAULT_FALSE = ("fuse_unk", "byte_fallback", "ignore_merges")
_LARGE = ("vocab", "merges")


def tokenizer_identity(data: bytes) -> str:
    """The sha256 of what a tokenizers JSON file does to text: its model (vocabulary, merges,
    options), normalizer, pre-tokenizer, post-processor (it decides a document's separator in
    ``data tokenize``), added and special tokens with their ids, truncation and padding. Two
    files that differ only in formatting, key order, escaping, the merges' form (``"a b"`` or
    ``["a", "b"]``), the order of their added tokens, defaults an older writer left out, a
    post-processor that adds nothing, the decoder or the version have one identity. Stdlib
    only: the same on every machine, whatever its tokenizers version.
    """
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise DataError(f"data.tokenizer: not a tokenizers JSON file ({exc})") from None
    if not isinstance(doc, dict):
        raise DataError("data.tokenizer: not a tokenizers JSON file (not a JSON object)")
    kept = _without_nulls({k: v for k, v in doc.items() if k not in _NOT_IDENTITY})
    if _adds_nothing(kept.get("post_processor")):  # transformers 5 saves "$A" as a template
        kept.pop("post_processor")
    added = kept.get("added_tokens")
    if isinstance(added, list):
        kept["added_tokens"] = sorted(added, key=lambda t: json.dumps(t, sort_keys=True))
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _without_nulls(value: Any) -> Any:
    """``value`` without the keys whose value is null (a tokenizers file's "absent") or a
    default False flag, and with merges in one form; a vocabulary or merges list is not walked
    (no nulls there, and walking 262k entries in Python would cost seconds)."""
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: v if k in _LARGE else _without_nulls(v) for k, v in value.items()}
    out = {k: v for k, v in out.items() if v is not None}
    out = {k: v for k, v in out.items() if not (k in _DEFAULT_FALSE and v is False)}
    merges = out.get("merges")
    if isinstance(merges, list) and any(isinstance(m, str) for m in merges):
        out["merges"] = [_pair(m) for m in merges]  # tokenizers < 0.20 wrote "a b"
    return out


def _adds_nothing(processor: Any) -> bool:
    """Whether a post-processor adds no token to one sequence (``data tokenize`` asks it for
    the tokens around a document): a template without special tokens, a ByteLevel one (it
    trims offsets), or a sequence of those."""
    if not isinstance(processor, dict):
        return False
    kind = processor.get("type")
    if kind == "ByteLevel":
        return True
    if kind == "TemplateProcessing":
        single = processor.get("single")
        return isinstance(single, list) and not any("SpecialToken" in p for p in single)
    if kind == "Sequence":
        return all(_adds_nothing(p) for p in processor.get("processors") or [])
    return False


def _pair(merge: Any) -> Any:
    parts = merge.split(" ") if isinstance(merge, str) else None
    return parts if parts is not None and len(parts) == 2 else merge


def load_tokenizer(setting: str) -> Any:
    """``byte``, a tokenizers JSON file, or one on the Hub (``hf://OWNER/MODEL/tokenizer.json``,
    downloaded once into the user cache through the project's Hub client)."""
    if setting == "byte":
        return ByteTokenizer()
    if setting.startswith("hf://"):
        from speedtronic.data.ingest.hub_source import cached_hub_file

        return HFTokenizer(cached_hub_file(setting))
    return HFTokenizer(setting)


def is_byte_level(tokenizer: Any) -> bool:
    return isinstance(tokenizer, ByteTokenizer)


def check_vocab(tokenizer: Any, model_vocab: int | None) -> None:
    """The model must embed every id: a smaller model vocabulary is an error.

    A larger one is fine (padding the vocabulary to a multiple of 64 is a common speed-up).
    """
    vocab = getattr(tokenizer, "vocab_size", None)
    if vocab is not None and model_vocab is not None and model_vocab < vocab:
        raise DataError(
            f"model.vocab_size: {model_vocab} is smaller than the tokenizer's vocabulary "
            f"({vocab}, {getattr(tokenizer, 'name', 'custom')}); set model.vocab_size: {vocab}"
        )

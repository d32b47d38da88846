"""Tokenizers for text sources: the byte-level default and Hugging Face ``tokenizers`` files.

A tokenizer here is any callable ``str -> list[int]`` with an optional ``vocab_size``
attribute; the two shipped ones also ``decode`` ids back to text, for generation.
``load_tokenizer`` resolves the ``data.tokenizer`` setting; ``check_vocab`` makes sure the model
can embed every id the tokenizer produces. How a checkpoint remembers the run's tokenizer is
``speedtronic.checkpoint.tokenizer``'s.
"""

from __future__ import annotations

from collections.abc import Callable
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

    def __call__(self, text: str) -> list[int]:
        return self._impl.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._impl.decode(ids, skip_special_tokens=False)

    def decode_stream(self, prefix: list[int]) -> TokenizersStream:
        """For ids arriving one at a time after ``prefix``, which decides e.g. whether a word
        starts with a space (``data.decoding``)."""
        return TokenizersStream(self.decode, self._impl, prefix)


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

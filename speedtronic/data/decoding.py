"""Decoding tokens as they arrive: the text they have settled, and at the end what is left.

``generate`` shows text token by token, but a token can end inside a character (a byte token
cut after a character's first byte), so the end of the text can still change. A stream hands
out only text no later token can change, and at the end (``finish``) the rest as the tokenizer
decodes it, so the pieces join to the tokenizer's ``decode`` of the same tokens (issue 57: the
tail was dropped). What can still change:

- bytes (``ByteStream``): at most the last incomplete UTF-8 sequence (3 bytes); a byte that
  can complete no character (a continuation without its lead, an invalid lead) shows as U+FFFD
  at once, as ``bytes.decode(errors="replace")`` shows it;
- a tokenizers file (``TokenizersStream``), which turns bytes into text itself: a trailing
  U+FFFD (a byte-level decoder's one U+FFFD for an incomplete character; an invalid byte at the
  very end is shown with the next token) and, with a byte-fallback decoder (``<0xE2>``
  tokens), the trailing run of byte tokens while its bytes are valid UTF-8 so far: that decoder
  shows a whole run as U+FFFDs once one byte of it is invalid, text already valid included.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from typing import Any

REPLACEMENT = "\ufffd"
CONTEXT_IDS = 16  # the prompt's newest ids kept as context (e.g. whether a word gets its space)


class ByteStream:
    """UTF-8 bytes, one token each, after ``prefix``."""

    def __init__(self, prefix: list[int]):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._decoder.decode(bytes(prefix))

    def step(self, token: int) -> str:
        """The text this byte settles ("" inside a character that may still complete)."""
        return self._decoder.decode(bytes([token]))

    def finish(self) -> str:
        """An incomplete character the bytes end inside, as U+FFFD ("" if none)."""
        return self._decoder.decode(b"", final=True)


class TokenizersStream:
    """A tokenizers file's ids after ``prefix``: each step decodes a short window of ids (those
    since the last point where nothing was held, as tokenizers' own DecodeStream does)."""

    def __init__(self, decode: Callable[[list[int]], str], impl: Any, prefix: list[int]):
        self._decode = decode  # the file's decode; ``impl`` its tokenizers.Tokenizer
        self._bytes = fallback_bytes(impl)  # id -> byte of <0xHH> tokens, or {}
        self._ids = list(prefix[-CONTEXT_IDS:])
        self._shown = self._decode(self._ids)  # the window's text already handed out
        self._settled = 0  # window ids up to the last point where nothing was held

    def step(self, token: int) -> str:
        """The text this id settles ("" while all its text may still change)."""
        self._ids.append(token)
        text = self._decode(self._ids)
        held = self._held(text)
        # what is held never shrinks what was shown: that stays a prefix of text
        new = text[len(self._shown) : len(text) - held]
        self._shown += new
        if not held and token not in self._bytes:  # settled, and no byte run goes on here:
            self._ids = self._ids[self._settled :]  # the window restarts at the previous point
            self._shown, self._settled = self._decode(self._ids), len(self._ids)
        return new

    def finish(self) -> str:
        """What was held at the end, as the file decodes it (U+FFFDs; "" if nothing)."""
        return self._decode(self._ids)[len(self._shown) :]

    def _held(self, text: str) -> int:
        """How many characters at the end of ``text`` a later token could still change."""
        if not self._bytes:
            return 1 if text.endswith(REPLACEMENT) else 0
        run = 0
        while run < len(self._ids) and self._ids[-1 - run] in self._bytes:
            run += 1
        if not run or not _valid_so_far(bytes(self._bytes[i] for i in self._ids[-run:])):
            return 0  # no run, or one already shown as U+FFFDs whatever follows
        return len(text) - len(self._decode(self._ids[:-run]))


def fallback_bytes(impl: Any) -> dict[int, int]:
    """id -> byte of a byte-fallback decoder's ``<0xHH>`` tokens; {} for any other decoder."""
    if "ByteFallback" not in repr(impl.decoder):
        return {}
    ids = {b: impl.token_to_id(f"<0x{b:02X}>") for b in range(256)}
    return {token: b for b, token in ids.items() if token is not None}


def _valid_so_far(data: bytes) -> bool:
    """Whether ``data`` is valid UTF-8 or the start of it (an incomplete last character)."""
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data)
    except UnicodeDecodeError:
        return False
    return True

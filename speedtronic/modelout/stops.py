"""Where generation stops: the run's end-of-document tokens, a stop text, or the token budget.

A model trained on documents joined by a separator ends a document by emitting it (issue 37:
an export with ``eos_token_id: null`` never stopped in transformers). ``stop_tokens`` finds
those tokens for a run as tokenize chose them (``data.ingest.encode.choose_separator``): the
byte tokenizer's ETX (0x03); a tokenizers file's post-processor specials (a BOS template: the
next document starting) or its end-of-text token (``<|endoftext|>``, ``</s>``, ...); and the
separator the run's token data recorded in its manifest. ``export`` writes the same ids as
``eos_token_id``, so transformers' ``generate`` stops where ``speedtronic generate`` does.
``Stopper`` is what ``generate`` asks after each token; the reason is ``eos``, ``stop_text``
or ``max_tokens``. ``Completion`` is the sample's text, the one the text and JSON outputs show.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedtronic.data.tokenizer import ByteTokenizer, HFTokenizer
from speedtronic.errors import DataError

STOP_EOS, STOP_TEXT, STOP_MAX = "eos", "stop_text", "max_tokens"


def stop_tokens(tokenizer: Any, config: dict | None = None) -> dict[int, str]:
    """id -> token text of the run's end-of-document tokens (see the module docstring)."""
    from speedtronic.data.ingest.encode import BYTE_SEPARATOR, EOT_NAMES, choose_separator

    found: dict[int, str] = _manifest_separator(config)
    if isinstance(tokenizer, ByteTokenizer):
        found.setdefault(BYTE_SEPARATOR, "\\x03")
    elif isinstance(tokenizer, HFTokenizer):
        from tokenizers import Tokenizer

        impl = Tokenizer.from_str(tokenizer.data.decode("utf-8"))
        try:
            separator = choose_separator(impl, None, tokenizer.name)
            found.update(zip(separator.before + separator.after, separator.tokens, strict=True))
        except DataError:  # a tokenizer that defines no document token: nothing to stop at
            pass
        for name in EOT_NAMES:
            token = impl.token_to_id(name)
            if token is not None:
                found.setdefault(token, name)
    return found


def separator_bos(tokenizer: Any) -> int | None:
    """The token a tokenizers file's template puts before each document (a BOS), if any."""
    if not isinstance(tokenizer, HFTokenizer):
        return None
    from tokenizers import Tokenizer

    from speedtronic.data.ingest.encode import choose_separator

    try:
        chosen = choose_separator(Tokenizer.from_str(tokenizer.data.decode("utf-8")), None, "")
    except DataError:
        return None
    templated = "template" in chosen.rule  # a BOS template, not an end-of-text token
    return chosen.before[0] if templated and chosen.before else None


def _manifest_separator(config: dict | None) -> dict[int, str]:
    """The separator the run's token data was written with (data.token_path's manifest)."""
    data = (config or {}).get("data") if isinstance(config, dict) else None
    where = data.get("token_path") if isinstance(data, dict) else None
    if not isinstance(where, str):
        return {}
    try:
        manifest = json.loads((Path(where) / "manifest.json").read_text(encoding="utf-8"))
        record = manifest["separator"]
        ids = [*record["before"], *record["after"]]
        return {int(i): str(t) for i, t in zip(ids, record["tokens"], strict=True)}
    except (OSError, ValueError, KeyError, TypeError):  # moved or other data: the tokenizer's
        return {}


@dataclass
class Completion:
    """A sample's text, decoded after the prompt (``stream``: ``decode_stream``'s), handed to
    ``write`` as soon as no stop text can begin in it, and ending before the first stop text.
    The text output prints what ``text`` ends as, and that is the JSON ``completion``: one text,
    the stop text left out of both. It is the tokenizer's decode of the sample's tokens (issue
    57): bytes that form no character show as U+FFFD, and a character the sample ends inside
    shows as the tokenizer decodes it (``finish``)."""

    stream: Any  # data.decoding's ByteStream or TokenizersStream
    texts: tuple[str, ...] = ()
    write: Callable[[str], None] | None = None
    text: str = ""
    shown: int = 0  # characters of text already written
    stopped: bool = False  # a stop text ended the text

    def add(self, token: int) -> bool:
        """Take one more token; True once a stop text is complete (``text`` now ends before it)."""
        return self._take(self.stream.step(token))

    def finish(self) -> str:
        """Write what was held back (no stop text followed it, though one may end in the
        stream's tail); the whole completion."""
        if not self.stopped:
            self._take(self.stream.finish())
        self._show(len(self.text))
        return self.text

    def _take(self, new: str) -> bool:
        self.text += new
        # a stop text cannot begin in what is shown: _safe held back every tail that could
        found = [i for stop in self.texts if (i := self.text.find(stop, self.shown)) >= 0]
        if found:
            self.text, self.stopped = self.text[: min(found)], True
        self._show(len(self.text) if found else self._safe())
        return bool(found)

    def _safe(self) -> int:
        """Where the earliest tail of ``text`` that a stop text begins with starts."""
        longest = max((len(stop) for stop in self.texts), default=0)
        for start in range(max(self.shown, len(self.text) - longest + 1), len(self.text)):
            if any(stop.startswith(self.text[start:]) for stop in self.texts):
                return start
        return len(self.text)

    def _show(self, end: int) -> None:
        if end > self.shown and self.write is not None:
            self.write(self.text[self.shown : end])
        self.shown = max(self.shown, end)


@dataclass
class Stopper:
    """Asked after each new token: why generation stops there, or None to go on. A token that
    is not an end-of-document token goes to ``completion``, whose text decides stop texts."""

    tokens: dict[int, str]
    completion: Completion | None = None

    def __call__(self, ids: list[int]) -> str | None:
        if ids and ids[-1] in self.tokens:
            return STOP_EOS
        if ids and self.completion is not None and self.completion.add(ids[-1]):
            return STOP_TEXT
        return None

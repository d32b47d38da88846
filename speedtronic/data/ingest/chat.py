"""Conversations into training examples: the model's chat template, rendered as transformers
renders it, and the loss mask that trains only the assistant's turns (issue 56 item 1).

**The template** (``find_template``) is the one beside the tokenizer: ``chat_template.jinja``,
else ``tokenizer_config.json``'s ``chat_template`` (what ``speedtronic import`` keeps in a run's
``tokenizer/`` folder, and what a transformers model folder holds); none is a one-line error
naming the file. The output folder keeps a copy; the manifest records its sha256.

**Rendering** mirrors ``transformers``' ``apply_chat_template`` (no transformers needed): a
sandboxed, immutable jinja2 environment with ``trim_blocks`` / ``lstrip_blocks``, the
``raise_exception`` global and the ``tojson`` filter, and the special tokens of
``tokenizer_config.json`` (``bos_token``, ``eos_token``, ...) as variables; the rendered text is
tokenized without adding special tokens (the template puts them), as transformers does.

**The mask**: for each assistant message ``i``, ``render(messages[:i], add_generation_prompt)``
is the prompt and ``render(messages[:i + 1])`` the prompt, the answer and the end of its turn;
the tokens between are trained on. Both must tokenize to prefixes of the whole conversation's
tokens, or the template is refused (its turns cannot be told apart by token). ``--train-on
all`` trains every token. A conversation longer than the slot (``seq_len + 1`` tokens: the
inputs and, shifted by one, the labels) is cut after the last assistant turn that fits (the
template's own rendering of that shorter conversation), or dropped when even the first answer
does not fit; one without an assistant turn is skipped. Each is counted; none is split inside
an answer. Kept conversations are packed (``masking: packed``, the default): laid whole into
slots first-fit in order, each slot's tail padded (``pad_id``, mask 0), and bit 1 of the mask
byte (``START``) set on each conversation's first token, so training keeps attention and RoPE
positions within a conversation; ``--pad`` (``masking: padded``) gives each its own slot and no
start bits. docs/data.md has the measurement that chose packing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from speedtronic.errors import DataError

TEMPLATE_FILE = "chat_template.jinja"
TRAIN_ON = ("assistant", "all")
SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")
START = 2  # mask bit 1: a conversation starts at this token (packed folders); bit 0: trained
COUNTS = ("conversations", "cut", "dropped", "no_assistant", "trained_tokens", "chat_tokens")


def tokenizer_folder(path: Path) -> Path:
    """The folder holding a model's tokenizer files: ``path`` itself, or a run's ``tokenizer/``
    (``speedtronic import``'s), or the folder of a ``tokenizer.json`` given as a file."""
    if path.is_file():
        return path.parent
    return path / "tokenizer" if (path / "tokenizer" / "tokenizer.json").is_file() else path


def find_template(folder: Path) -> tuple[str, dict[str, str], str]:
    """``(template, special tokens, the file it came from)`` of the tokenizer in ``folder``."""
    config_path = folder / "tokenizer_config.json"
    config: dict = {}
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DataError(f"--tokenizer: {config_path} is not readable JSON ({exc})") from None
    specials = {k: _content(config.get(k)) for k in SPECIAL_KEYS if _content(config.get(k))}
    jinja = folder / TEMPLATE_FILE
    if jinja.is_file():
        # bytes decoded as import reads them (no newline translation): the same sha256
        return jinja.read_bytes().decode("utf-8", "replace"), specials, str(jinja)
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # named templates (transformers 4): the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not isinstance(template, str) or not template.strip():
        raise DataError(
            f"--chat: {config_path} has no chat_template (and there is no {TEMPLATE_FILE} beside "
            "it): conversations are rendered with the model's own template; name a tokenizer "
            "folder that has one"
        )
    return template, specials, str(config_path)


def _content(token: Any) -> str | None:
    token = token.get("content") if isinstance(token, dict) else token
    return token if isinstance(token, str) and token else None


def compile_template(template: str, where: str) -> Any:
    """The template compiled in transformers' environment (``apply_chat_template``'s)."""
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise DataError(
            "--chat: rendering chat templates needs the 'jinja2' package",
            hint="pip install 'speedtronic[data]'",
        ) from None

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template)
    except TemplateError as exc:
        raise DataError(f"--chat: the chat template of {where} does not compile: {exc}") from None


class Conversations:
    """Renders, tokenizes and masks conversations in a tokenize worker (see the docstring)."""

    def __init__(self, setup: dict, template: str, impl: Any):
        self.compiled = compile_template(template, setup["template_from"])
        self.specials, self.impl = setup["specials"], impl
        self.slot = setup["seq_len"] + 1  # the inputs, and the labels shifted by one
        self.train_on, self.pad_id = setup["train_on"], setup["pad_id"]
        self.packed = setup.get("masking") == "packed"
        self.where, self.last_cut = "", False  # the row being encoded; whether it was cut

    def render(self, messages: list, generation: bool) -> str:
        from jinja2 import TemplateError

        try:
            return self.compiled.render(
                messages=messages, add_generation_prompt=generation, **self.specials
            )
        except TemplateError as exc:
            raise DataError(f"{self.where}: the chat template raised: {exc}") from None
        except Exception as exc:  # a template's own bug (a missing key, a bad operand)
            raise DataError(
                f"{self.where}: the chat template failed ({type(exc).__name__}: {exc})"
            ) from None

    def encode(self, messages: list, where: str) -> tuple[str, list[int], list[int]] | str:
        """``(rendered text, ids, mask)`` of one conversation, or why it is left out
        (``no_assistant``, ``dropped``); ``cut`` is said by ``last_cut``."""
        self.where, self.last_cut = where, False
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not turns:
            return "no_assistant"
        text = self.render(messages, False)
        ids = self._ids([text])[0]
        spans = self._spans(messages, turns, ids) if self.train_on == "assistant" else None
        if len(ids) > self.slot:
            ends = [end for _, end in spans] if spans else self._ends(messages, turns, ids)
            fits = [end for end in ends if end <= self.slot]
            if not fits:
                return "dropped"
            ids, self.last_cut = ids[: fits[-1]], True
        mask = [0] * len(ids)
        for start, end in spans if spans is not None else [(0, len(ids))]:
            mask[start : min(end, len(ids))] = [1] * max(0, min(end, len(ids)) - start)
        mask[0] = 0  # a label is the next token: the first one is no token's label
        return text, ids, mask

    def _ids(self, texts: list[str]) -> list[list[int]]:
        try:
            return [e.ids for e in self.impl.encode_batch(texts, add_special_tokens=False)]
        except (UnicodeEncodeError, TypeError, ValueError) as exc:
            raise DataError(f"{self.where}: the conversation cannot be tokenized: {exc}") from None

    def _spans(self, messages: list, turns: list[int], ids: list[int]) -> list[tuple[int, int]]:
        """Each assistant turn's tokens ``[start, end)`` in ``ids`` (the whole's)."""
        texts = [
            t for i in turns for t in (self.render(messages[:i], True), self._upto(messages, i))
        ]
        found = self._ids(texts)
        spans = []
        for k, i in enumerate(turns):
            prompt, full = found[2 * k], found[2 * k + 1]
            if ids[: len(prompt)] != prompt or ids[: len(full)] != full or len(full) <= len(prompt):
                raise DataError(
                    f"{self.where}: the chat template does not render message {i} (assistant) "
                    "as a continuation of the conversation before it, so its tokens cannot be "
                    "told from the prompt's; use --train-on all, or a template that does"
                )
            spans.append((len(prompt), len(full)))
        return spans

    def _ends(self, messages: list, turns: list[int], ids: list[int]) -> list[int]:
        """Where each assistant turn ends in ``ids`` (``--train-on all``: to cut at a turn)."""
        found = self._ids([self._upto(messages, i) for i in turns])
        return [len(f) for f in found if ids[: len(f)] == f]

    def _upto(self, messages: list, i: int) -> str:
        return self.render(messages[: i + 1], False)

    def slots(self, kept: list[tuple[list[int], list[int]]], dtype) -> tuple:
        """The conversations in slots: tokens, mask (uint8: bit 0 trained, ``START`` where a
        packed conversation begins) and each slot's conversations (indices into ``kept``)."""
        sizes = [len(ids) for ids, _ in kept]
        rows = self._pack(sizes) if self.packed else [[i] for i in range(len(kept))]
        tokens = np.full((len(rows), self.slot), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), self.slot), dtype=np.uint8)
        for r, row in enumerate(rows):
            at = 0
            for i in row:
                ids, bits = kept[i]
                tokens[r, at : at + len(ids)], mask[r, at : at + len(bits)] = ids, bits
                mask[r, at] |= START if self.packed else 0
                at += len(ids)
        return tokens.reshape(-1).astype(dtype), mask.reshape(-1), rows

    def _pack(self, sizes: list[int]) -> list[list[int]]:
        """First fit in order: each conversation, whole, into the first slot with room for it
        (a new one if none has), so slots open in the order of their first conversation."""
        room, rows = np.zeros(len(sizes), np.int64), []
        for i, n in enumerate(sizes):
            fits = np.flatnonzero(room[: len(rows)] >= n)
            k = int(fits[0]) if fits.size else len(rows)
            if k == len(rows):
                rows.append([])
                room[k] = self.slot
            rows[k].append(i)
            room[k] -= n
        return rows


def check_messages(value: Any, where: str, key: str) -> list:
    """``value`` as a conversation: a non-empty list of objects with a text ``role``."""
    if not isinstance(value, list) or not value:
        kind = "an empty list" if value == [] else type(value).__name__
        raise DataError(f"{where}: field {key!r} is {kind}, not a list of messages")
    for n, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise DataError(
                f"{where}: message {n} of {key!r} is not an object with a text 'role' "
                f"(got {json.dumps(message)[:80]})"
            )
    return value


def encode_unit(convo: Conversations, encoder: Any, rows: list, skipped: int) -> Any:
    """A unit's conversations (``(where, messages)`` rows) as one ``Encoded`` whose documents
    are slots, split into train and val by the held-out rule on each conversation's text."""
    from speedtronic.data.ingest.encode import Encoded, held_out

    counts, sizes = dict.fromkeys(COUNTS, 0), []
    kept: list[tuple[bool, list[int], list[int]]] = []
    for where, messages in rows:
        found = convo.encode(messages, where)
        if isinstance(found, str):
            counts[found] += 1
            continue
        text, ids, mask = found
        counts["cut"] += convo.last_cut
        counts["trained_tokens"] += sum(mask)
        counts["chat_tokens"] += len(ids)  # the rest of its slot is padding
        sizes.append(len(ids))
        kept.append((held_out(text, encoder.val_fraction), ids, mask))
    counts["conversations"] = len(kept)
    parts, entries = [], []  # an entry a slot: (its first conversation, val, conversations, tokens)
    for val in (False, True):
        index = [n for n, (flag, _, _) in enumerate(kept) if flag == val]
        tokens, mask, rows = convo.slots([kept[n][1:] for n in index], encoder.dtype)
        parts.append((tokens, mask))
        entries += [(index[row[0]], val, len(row), sum(sizes[index[i]] for i in row))
                    for row in rows]  # fmt: skip
    entries.sort()  # in the unit's order, each part's slots in theirs: a --max-tokens cap
    counts["sizes"] = [e[3] for e in entries]  # sums these per slot, as it sums the slots
    counts["slot_conversations"] = [e[2] for e in entries]
    flags = np.array([e[1] for e in entries], dtype=bool)
    lengths = np.full(len(entries), convo.slot, dtype=np.int64)
    top = max((int(ids.max()) for ids, _ in parts if ids.size), default=-1)
    return Encoded(
        parts[0][0], parts[1][0], lengths, flags, int((~flags).sum()), int(flags.sum()),
        skipped, top, np.zeros(len(entries), np.int64), parts[0][1], parts[1][1], counts,
    )  # fmt: skip

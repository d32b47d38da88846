"""Documents to token ids: the document separator, the held-out rule, and the encoding itself.

**Separator** (``choose_separator``), at most two tokens a document, from what the tokenizer
defines:

1. ``--separator TOKEN``: that token (it must be in the vocabulary), before each document;
2. a post-processor template that adds special tokens to a single sequence (a BOS such as
   ``<|begin_of_text|>``, or BOS and EOS): exactly those, where the template puts them;
3. an end-of-text token (``<|endoftext|>``, ``<|end_of_text|>``, ``</s>``, ``<eos>``, ...):
   before each document, as GPT-2's training data and llm.c do;
4. the byte tokenizer: byte ``0x03`` (ASCII ETX, "end of text") before each document.

A tokenizer with none of these is an error asking for ``--separator``. docs/data.md says what a
model learns from the separator.

**Held out** (``--val-fraction F``): a document goes to the validation part when the first 8
bytes of BLAKE2b of its UTF-8 text, read as an integer, fall below ``F * 2**64``: by content, so
the same document lands on the same side whatever the order, the sharding, the workers or the
tokenizer, and exact duplicates never straddle the split. A text file is one document, decided
by its first segment.

``Encoder`` runs in the workers (no torch): ``tokenizers``' batch encoding on one thread per
process (the pipeline runs one process per core), ids assembled with NumPy. A document longer
than ``PIECE_CHARS`` is encoded piece by piece, cut only between a non-space character, a single
newline and an ASCII non-space character, where GPT-2's and Llama 3's pre-tokenizers split
anyway (so the ids equal the whole's): ``tokenizers`` keeps ~150 bytes a token while it encodes
(a 16 MB document peaked at 2.35 GB whole), and the limit of ``--max-document-bytes`` is only a
bound on memory if a long document costs a few times its size.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import asdict, dataclass
from itertools import chain
from typing import Any

import numpy as np

from speedtronic.errors import DataError

BYTE_SEPARATOR = 0x03
EOT_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[EOS]", "<|eot|>")
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
PIECE_CHARS = 1 << 20  # a longer document is encoded in pieces of about this many characters
# Where byte-level regex pre-tokenizers (GPT-2's, Llama 3's) split anyway: "x\n|a" (never in
# "\n\n", which becomes one pre-token at a piece's end) and "x| y" (the space goes with "y")
_CUT = re.compile(r"(?<=\S\n)(?=[!-~])|(?<=[A-Za-z])(?= [A-Za-z])")
_CUT_SCAN = 1 << 18  # how far past a nominal cut to look for a safe one


def pieces(text: str, size: int) -> list[str]:
    """``text`` cut into pieces of about ``size`` characters at safe points. With none within
    ``_CUT_SCAN`` of a nominal cut (a run of a quarter million characters without a space or
    line break) the cut is made there anyway, as ``segments`` does for a text file: the one
    place a merge could differ from the whole's, and the price of bounded memory."""
    cuts = [0]
    while cuts[-1] + size < len(text):
        nominal = cuts[-1] + size
        found = _CUT.search(text, nominal, nominal + _CUT_SCAN)
        cuts.append(found.start() if found else min(nominal + _CUT_SCAN, len(text)))
        if cuts[-1] >= len(text):
            cuts.pop()
            break
    return [text[a:b] for a, b in _spans(cuts, text)]


def splits_like_bytelevel(impl: Any) -> bool:
    """Whether pieces cut at ``_CUT`` encode as the whole: a byte-level pre-tokenizer without
    a prefix space (that would go before every piece) and no normalizer beyond NFC/NFKC."""
    pre, norm = repr(impl.pre_tokenizer), impl.normalizer
    plain = norm is None or type(norm).__name__ in ("NFC", "NFKC")
    return "ByteLevel(" in pre and "add_prefix_space=True" not in pre and plain


def _spans(cuts: list[int], text: str) -> list[tuple[int, int]]:
    return list(zip(cuts, [*cuts[1:], len(text)], strict=True))


@dataclass(frozen=True)
class Separator:
    """Token ids put ``before`` and ``after`` every document; ``rule`` says why these."""

    before: tuple[int, ...]
    after: tuple[int, ...]
    tokens: tuple[str, ...]
    rule: str

    def record(self) -> dict:
        return {**asdict(self), "before": list(self.before), "after": list(self.after)}

    @classmethod
    def from_record(cls, doc: dict) -> Separator:
        return cls(tuple(doc["before"]), tuple(doc["after"]), tuple(doc["tokens"]), doc["rule"])


def choose_separator(impl: Any, explicit: str | None, name: str) -> Separator:
    """The separator for a ``tokenizers.Tokenizer`` (``impl``), or the byte one for None."""
    if impl is None:
        if explicit is not None:
            raise DataError("--separator: the byte tokenizer's separator is byte 0x03 (fixed)")
        return Separator((BYTE_SEPARATOR,), (), ("\\x03",), "byte tokenizer: ETX (0x03)")
    if explicit is not None:
        found = impl.token_to_id(explicit)
        if found is None:
            raise DataError(f"--separator: {explicit!r} is not a token of {name}")
        return Separator((found,), (), (explicit,), "--separator")
    template = _template(impl)
    if template is not None:
        return template
    for token in EOT_NAMES:
        found = impl.token_to_id(token)
        if found is not None:
            return Separator((found,), (), (token,), f"end-of-text token {token}")
    raise DataError(
        f"--tokenizer: {name} defines no document token (no BOS/EOS template, no "
        f"{', '.join(EOT_NAMES[:4])}); name one with --separator TOKEN"
    )


def _template(impl: Any) -> Separator | None:
    """What the tokenizer's post-processor adds around one sequence, if anything."""
    plain = impl.encode("a", add_special_tokens=False).ids
    wrapped = impl.encode("a", add_special_tokens=True).ids
    if wrapped == plain or not plain:
        return None
    for cut in range(len(wrapped) - len(plain) + 1):
        if wrapped[cut : cut + len(plain)] == plain:
            before, after = tuple(wrapped[:cut]), tuple(wrapped[cut + len(plain) :])
            if len(before) + len(after) > 2:
                raise DataError(
                    f"--tokenizer: its template adds {len(before) + len(after)} tokens to a "
                    "document (at most 2); name one with --separator TOKEN"
                )
            tokens = tuple(impl.id_to_token(i) or str(i) for i in before + after)
            return Separator(before, after, tokens, "the tokenizer's post-processor template")
    return None


def held_out(text: str, fraction: float) -> bool:
    if fraction <= 0:
        return False
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2**64


def _utf8_bytes(text: str) -> int:
    """The UTF-8 size of ``text`` (a lone surrogate from a JSON escape counts its 3 bytes)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


@dataclass
class Encoded:
    """One unit's tokens: the train and validation parts, and per document (in order) its
    length, part and UTF-8 bytes of text, so a token cap can stop at a document's end and the
    manifest can say how many bytes of text each shard holds (bits per byte, issue 53)."""

    train: np.ndarray
    val: np.ndarray
    lengths: np.ndarray  # tokens per document (or per text segment), in input order
    is_val: np.ndarray  # bool per entry of lengths
    train_documents: int  # documents started in this unit, per part
    val_documents: int
    skipped: int = 0
    max_id: int = -1
    nbytes: np.ndarray | None = None  # UTF-8 bytes of text per entry of lengths
    # chat data (``chat``): per token of train / val, bit 0 where it is a label trained on
    train_mask: np.ndarray | None = None
    val_mask: np.ndarray | None = None
    chat: dict | None = None  # conversations kept, cut, dropped, without an answer; tokens trained

    @property
    def documents(self) -> int:
        return self.train_documents + self.val_documents

    def text_bytes(self, val: bool) -> int:
        """The UTF-8 bytes of the text behind the train (or, ``val``, held-out) tokens."""
        if self.nbytes is None:
            return 0
        return int(self.nbytes[self.is_val == val].sum())


class Encoder:
    """Tokenizes documents for one worker: ``tokenizer_file`` None means bytes."""

    def __init__(
        self, tokenizer_file: str | None, separator: Separator, val_fraction: float, dtype: str
    ):
        self.separator, self.val_fraction = separator, val_fraction
        self.dtype = DTYPES[dtype]
        self._impl = None
        if tokenizer_file is not None:
            os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one process per core already
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
            from tokenizers import Tokenizer

            self._impl = Tokenizer.from_file(tokenizer_file)
            self._impl.no_truncation()
            self._impl.no_padding()
            # the same ids without offsets (tokenizers >= 0.21), else the plain batch call
            self._encode_batch = getattr(self._impl, "encode_batch_fast", self._impl.encode_batch)
        self._pieces = self._impl is not None and splits_like_bytelevel(self._impl)

    def documents(self, docs: list[str], skipped: int = 0) -> Encoded:
        flags = np.array([held_out(d, self.val_fraction) for d in docs], dtype=bool)
        if self.val_fraction <= 0 or not flags.any():
            train, lengths = self._join(docs)
            val = np.zeros(0, self.dtype)
        else:
            idx = np.flatnonzero(~flags).tolist(), np.flatnonzero(flags).tolist()
            train, train_len = self._join([docs[i] for i in idx[0]])
            val, val_len = self._join([docs[i] for i in idx[1]])
            lengths = np.zeros(len(docs), np.int64)
            lengths[~flags], lengths[flags] = train_len, val_len
        held = int(flags.sum())
        nbytes = np.fromiter((_utf8_bytes(d) for d in docs), np.int64, len(docs))
        return self._done(train, val, lengths, flags, (len(docs) - held, held), skipped, nbytes)

    def text(self, text: str, first: bool, val: bool) -> Encoded:
        """A text file's segment; ``first`` starts its document (the separator before it)."""
        empty = np.zeros(0, self.dtype)
        if not text:
            return self._done(empty, empty, np.zeros(0, np.int64), np.zeros(0, bool), (0, 0))
        before = self.separator.before if first else ()
        if self._impl is None:
            raw = bytes(before) + text.encode("utf-8")
            part = np.frombuffer(raw, np.uint8).astype(self.dtype)
        else:
            part = self._cast(np.asarray([*before, *self._ids([text])[0]], dtype=np.int64))
        train, held = (empty, part) if val else (part, empty)
        documents = (0, int(first)) if val else (int(first), 0)
        nbytes = np.array([_utf8_bytes(text)])
        return self._done(train, held, np.array([len(part)]), np.array([val]), documents, 0, nbytes)

    def _done(
        self, train, val, lengths, flags, documents: tuple[int, int], skipped=0, nbytes=None
    ) -> Encoded:
        top = max((int(a.max()) for a in (train, val) if a.size), default=-1)
        nbytes = np.zeros(len(lengths), np.int64) if nbytes is None else nbytes
        return Encoded(train, val, lengths, flags, *documents, skipped, top, nbytes)

    def _ids(self, docs: list[str]) -> list:
        """Each document's ids: a list, or for a long document an int64 array of its pieces'."""
        try:
            if not self._pieces or all(len(d) <= PIECE_CHARS for d in docs):
                return [e.ids for e in self._encode_batch(docs, add_special_tokens=False)]
            return [self._long(d) if len(d) > PIECE_CHARS else self._ids([d])[0] for d in docs]
        except (UnicodeEncodeError, TypeError, ValueError) as exc:  # a lone surrogate escape
            raise DataError(f"a document cannot be tokenized: {exc}") from None

    def _long(self, text: str) -> np.ndarray:
        encode = self._encode_batch
        parts = [  # each piece's ids to an array at once: a Python int costs 36 bytes
            np.asarray(encode([p], add_special_tokens=False)[0].ids, np.int64)
            for p in pieces(text, PIECE_CHARS)
        ]
        return np.concatenate(parts)

    def _join(self, docs: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``before + ids + after`` of every document, concatenated; and each one's length."""
        if not docs:
            return np.zeros(0, self.dtype), np.zeros(0, np.int64)
        sep = self.separator
        if self._impl is None:
            raw = [d.encode("utf-8") for d in docs]
            joined = bytes(sep.before) + bytes(sep.before).join(raw)
            lengths = np.fromiter((len(r) + 1 for r in raw), np.int64, len(raw))
            return np.frombuffer(joined, np.uint8).astype(self.dtype), lengths
        ids = self._ids(docs)
        extra = len(sep.before) + len(sep.after)
        lengths = np.fromiter((len(i) + extra for i in ids), np.int64, len(ids))
        if any(isinstance(one, np.ndarray) for one in ids):  # a long document: no Python ints
            bounds = (np.asarray(sep.before, np.int64), np.asarray(sep.after, np.int64))
            parts = [(bounds[0], np.asarray(one, np.int64), bounds[1]) for one in ids]
            return self._cast(np.concatenate(list(chain.from_iterable(parts)))), lengths
        flat = np.fromiter(
            chain.from_iterable(chain.from_iterable((sep.before, one, sep.after) for one in ids)),
            np.int64,
            int(lengths.sum()),
        )
        return self._cast(flat), lengths

    def _cast(self, tokens: np.ndarray) -> np.ndarray:
        if tokens.size and int(tokens.max()) > np.iinfo(self.dtype).max:
            top, kind = int(tokens.max()), self.dtype.__name__
            raise DataError(f"token id {top} does not fit {kind}; use --dtype uint32")
        return tokens.astype(self.dtype)

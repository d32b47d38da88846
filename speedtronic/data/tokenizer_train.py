"""Training a byte-level BPE tokenizer (``data tokenizer train``) on what ``data tokenize`` reads.

**Documents** come from the ingest layer's source listing (``spec.local_inputs``: files,
directories, globs) and readers (``formats.units`` and ``formats.Reader``): the same formats
(text, JSON Lines plain or ``.gz`` / ``.zst``, Parquet), the same ``--column``, the same one-line
errors and the same bound on a document's size. A text file's ~1 MiB segments (cut where
byte-level pre-tokenizers split anyway) count as its documents here.

**Held out**: a document whose hash falls in the held-out slice (``encode.held_out``, the rule of
``data tokenize --val-fraction``) is not trained on; up to ``HELD_OUT_BYTES`` of them measure the
result: UTF-8 bytes per token (higher compresses better), and the same for ``--compare``'s file.

**The model** is GPT-2's kind, so any text encodes and ``data tokenize`` cuts long documents
safely (``encode.splits_like_bytelevel``): GPT-2's regex byte-level pre-tokenizer without a prefix
space, BPE merges over the 256 byte symbols, the byte-level decoder, no post-processor. The
special tokens take the first ids, the document separator ``<|endoftext|>`` id 0, which is the
token ``data tokenize --tokenizer OUT`` puts before each document (``encode.EOT_NAMES``). Every
occurrence of a special token in text encodes as that token (and vanishes when decoded with
``skip_special_tokens``), so one must be delimited as text seldom is (``SPECIAL_SHAPE``).

**No document**: a document of whitespace alone (an empty ``.txt``, ``{"text": ""}``) is skipped
in every format; sources holding nothing else are refused, nothing written.

**Owning OUT** (DESIGN §5c): OUT is written atomically (a temporary sibling, fsync, rename), then
a record beside it, ``.OUT.tokenizer-train.json`` (its sha256, the request, the figures). An
existing OUT is replaced only when that record says this command wrote it and it has not changed
since; anything else there is refused, untouched. A second writer of the same OUT is refused by
tokenize's lock (``owner.OutLock`` on ``.OUT.lock``). Needs ``tokenizers`` (the ``[data]`` extra).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from speedtronic.data.ingest import formats, spec
from speedtronic.data.ingest.encode import held_out
from speedtronic.data.ingest.owner import OutLock, lock_path
from speedtronic.errors import DataError, SpeedtronicError

SEPARATOR = "<|endoftext|>"  # the first name data tokenize looks for (encode.EOT_NAMES)
MAX_VOCAB = 1 << 20
HELD_OUT_BYTES = 8 << 20  # held-out text kept to measure on; the rest is only counted
RECORD_KIND = "speedtronic data tokenizer train"
# <name> (no whitespace or angle brackets inside, a letter or digit among them) or [NAME]: words,
# punctuation and operators such as <=> or [1] occur in ordinary text, and would be cut out of it
SPECIAL_SHAPE = re.compile(r"<[^\s<>]*[A-Za-z0-9][^\s<>]*>|\[[A-Z][A-Z0-9_]*\]")


@dataclass(frozen=True)
class TrainRequest:
    sources: tuple[str, ...]
    vocab_size: int
    column: str = "text"
    held_out: float = 0.01
    specials: tuple[str, ...] = ()
    min_frequency: int = 2
    max_document_bytes: int = formats.MAX_DOCUMENT_BYTES

    @property
    def special_tokens(self) -> list[str]:
        return [SEPARATOR, *(s for s in dict.fromkeys(self.specials) if s != SEPARATOR)]


def check_request(request: TrainRequest) -> None:
    lowest = 256 + len(request.special_tokens)
    if not lowest <= request.vocab_size <= MAX_VOCAB:
        raise DataError(
            f"--vocab-size: must be in [{lowest}, {MAX_VOCAB}] (256 bytes + "
            f"{len(request.special_tokens)} special token(s), at most 2**20; got "
            f"{request.vocab_size})"
        )
    if not 0 <= request.held_out < 1:
        raise DataError(f"--held-out: must be in [0, 1) (got {request.held_out})")
    if request.min_frequency < 1:
        raise DataError(f"--min-frequency: must be >= 1 (got {request.min_frequency})")
    if request.max_document_bytes < 1:
        raise DataError(f"--max-document-bytes: must be >= 1 (got {request.max_document_bytes})")
    for token in request.specials:
        if not SPECIAL_SHAPE.fullmatch(token):
            raise DataError(
                f"--special {token!r}: a special token must be delimited as ordinary text is not: "
                "<|name|>, <name> or [NAME], no spaces inside (text holding it would be encoded as "
                "that token and lost when decoded with skip_special_tokens)"
            )


def tokenizers_module() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise DataError(
            "data tokenizer train needs the 'tokenizers' package",
            hint="pip install 'speedtronic[data]'",
        ) from None
    return tokenizers


# -- what is at OUT ----------------------------------------------------------------------------


def record_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.tokenizer-train.json")


def check_out(out: Path) -> None:
    """Refuse an OUT this command may not write: not a .json name, or a file it did not write."""
    if out.suffix != ".json" or out.name.startswith("."):
        raise DataError(f"OUT {str(out)!r}: name a .json file (e.g. tokenizer.json)")
    if not os.path.lexists(out):
        return
    if out.is_symlink() or not out.is_file():
        raise DataError(f"{out} exists and is not a regular file; name a new file")
    if not _ours(out):
        raise DataError(
            f"{out} exists and was not written by data tokenizer train (or changed since); "
            "remove it or name another file"
        )


def _ours(out: Path) -> bool:
    try:
        doc = json.loads(record_path(out).read_text(encoding="utf-8"))
        return doc["kind"] == RECORD_KIND and doc["sha256"] == _sha256(out.read_bytes())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_owned(out: Path, text: str, record: dict) -> None:
    """``text`` to ``out`` atomically and durably, then the record that says this wrote it."""
    from speedtronic.data.ingest.writer import cannot_write, fsync_dir, write_json

    data = text.encode("utf-8")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise cannot_write(out, exc) from None
    fsync_dir(out.parent)
    write_json(record_path(out), {**record, "kind": RECORD_KIND, "sha256": _sha256(data)})


# -- documents ---------------------------------------------------------------------------------


class Documents:
    """The training documents of the inputs, in order; held-out ones kept aside (up to
    ``HELD_OUT_BYTES``). An input error is kept in ``error`` and ends the stream: the Rust
    trainer pulling from it would otherwise turn it into its own exception."""

    def __init__(self, inputs: list[spec.InputFile], request: TrainRequest):
        self.inputs, self.request = inputs, request
        self.held: list[str] = []
        self.counts = {"documents": 0, "bytes": 0, "held_out_documents": 0, "held_out_bytes": 0}
        self.error: SpeedtronicError | None = None

    def __iter__(self) -> Iterator[str]:
        try:
            for text in self._all():
                if not text or text.isspace():  # nothing to learn a merge from
                    continue
                if not held_out(text, self.request.held_out):
                    self._count("", text)
                    yield text
                else:
                    self._hold(text)
        except SpeedtronicError as exc:
            self.error = exc

    def _all(self) -> Iterator[str]:
        column, limit = self.request.column, self.request.max_document_bytes
        reader = formats.Reader(column, limit)
        for index, file in enumerate(self.inputs):
            for unit in formats.units(file.format, file.path, file.name, index, column, limit):
                if file.format == "text":
                    yield reader.text(unit, file.path, file.name)
                else:
                    yield from reader.documents(unit, file.format, file.path, file.name)[0]

    def _count(self, prefix: str, text: str) -> int:
        size = len(text.encode("utf-8", "surrogatepass"))
        self.counts[f"{prefix}documents"] += 1
        self.counts[f"{prefix}bytes"] += size
        return size

    def _hold(self, text: str) -> None:
        kept = self.counts["held_out_bytes"]
        self._count("held_out_", text)
        if kept < HELD_OUT_BYTES:
            self.held.append(text)


def list_inputs(sources: tuple[str, ...], out: Path) -> list[spec.InputFile]:
    avoid = tuple(os.path.realpath(p) for p in (out, record_path(out), lock_path(out)))
    inputs: list[spec.InputFile] = []
    for source in sources:
        if spec.is_hub(source):
            raise DataError(
                f"{source}: data tokenizer train reads local files; download a sample first "
                "(e.g. hf download --repo-type dataset ... --local-dir DIR) and name DIR"
            )
        inputs += spec.local_inputs(source, avoid)
    for file in inputs:
        if os.path.realpath(file.path) in avoid:
            raise DataError(f"{file.name}: this source is the output {out}; name another OUT")
    return inputs


# -- training and measuring --------------------------------------------------------------------


def new_tokenizer(tk: Any) -> Any:
    """An untrained GPT-2-style byte-level BPE tokenizer."""
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = tk.decoders.ByteLevel()
    return tokenizer


def bpe_trainer(tk: Any, request: TrainRequest) -> Any:
    return tk.trainers.BpeTrainer(
        vocab_size=request.vocab_size,
        min_frequency=request.min_frequency,
        special_tokens=request.special_tokens,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )


def train(request: TrainRequest, out: Path, compare: str | None = None) -> dict:
    """Train on ``request.sources``, write ``out``, return the report (see ``data.md``)."""
    tk = tokenizers_module()
    check_request(request)
    check_out(out)
    other = load_compare(tk, compare) if compare is not None else None
    documents = Documents(list_inputs(request.sources, out), request)
    tokenizer, trainer = new_tokenizer(tk), bpe_trainer(tk, request)
    with OutLock(out, "data tokenizer train"):
        check_out(out)  # again, under the lock: what is there now is what gets replaced
        tokenizer.train_from_iterator(documents, trainer=trainer)
        if documents.error is not None:
            raise documents.error
        if not documents.counts["documents"]:
            raise no_document(request, documents.counts["held_out_documents"])
        report = _report(request, out, tokenizer, documents, other, compare)
        write_owned(out, tokenizer.to_str(), {"request": asdict(request), "report": report})
    return report


def no_document(request: TrainRequest, held: int) -> DataError:
    sources = ", ".join(request.sources)
    if held:
        return DataError(
            f"{sources}: all {held} document(s) fell in the held-out slice; lower --held-out "
            f"(got {request.held_out}) or add text"
        )
    return DataError(f"{sources}: no document to train on (empty or whitespace-only text)")


def load_compare(tk: Any, path: str) -> Any:
    if not Path(path).is_file():
        raise DataError(f"--compare: file not found: {path}")
    try:
        return tk.Tokenizer.from_file(path)
    except Exception as exc:  # the Rust side raises a plain Exception for a bad file
        raise DataError(f"--compare: {path} is not a tokenizers JSON file: {exc}") from None


def bytes_per_token(tokenizer: Any, texts: list[str]) -> float | None:
    """UTF-8 bytes per token over ``texts`` (no special tokens); None without text."""
    size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    tokens = sum(len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False))
    return size / tokens if tokens else None


def _report(request, out, tokenizer, documents, other, compare) -> dict:
    held = documents.held
    return {
        "out": str(out),
        "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
        "vocab_size_asked": request.vocab_size,
        "special_tokens": request.special_tokens,
        "separator": SEPARATOR,
        "files": len(documents.inputs),
        **documents.counts,
        "measured_bytes": sum(len(t.encode("utf-8", "surrogatepass")) for t in held),
        "bytes_per_token": bytes_per_token(tokenizer, held),
        "compare": compare,
        "compare_bytes_per_token": bytes_per_token(other, held) if other is not None else None,
    }

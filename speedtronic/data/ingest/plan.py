"""What one tokenize will do, fixed before the first token: inputs, tokenizer, separator, options.

``Request`` is what the user asked (the command line); ``Plan`` is that request resolved: every
input file in order (Hub revisions pinned to commit shas), the tokenizer copied into the output
folder (``tokenizer.json``; a Hub one downloaded there first), its separator, the dtype. The
plan is the first thing the journal records: a resumed tokenize takes the plan from the journal
rather than resolving again (a Hub branch may have moved since; a resume must read the same
files), after checking that the request is the same and that no local input changed size or
modification time. Stdlib (and ``tokenizers`` to pick the separator).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from speedtronic.data.ingest import spec
from speedtronic.data.ingest.encode import Separator, choose_separator
from speedtronic.data.ingest.formats import MAX_DOCUMENT_BYTES
from speedtronic.data.ingest.spec import InputFile
from speedtronic.errors import DataError

FORMAT_VERSION = 1
TOKENIZER_FILE = "tokenizer.json"
SHARD_TOKENS = 100_000_000  # ~200 MB of uint16 a shard (llm.c's fineweb shards are 1e8 too)


@dataclass(frozen=True)
class Request:
    sources: tuple[str, ...]
    tokenizer: str = "byte"
    column: str = "text"
    val_fraction: float = 0.0
    max_tokens: int | None = None
    dtype: str = "auto"
    shard_tokens: int = SHARD_TOKENS
    separator: str | None = None
    flat: bool = False
    max_document_bytes: int = MAX_DOCUMENT_BYTES
    chat: bool = False  # rows are conversations (data.ingest.chat)
    messages_key: str = "messages"
    seq_len: int | None = None
    train_on: str = "assistant"
    pad: bool = False  # chat: one conversation a slot, not packed (data.ingest.chat)

    def record(self) -> dict:
        """What the journal and manifest keep: what shapes the bytes written (the document
        limit only decides whether a run is refused, so a resume may raise it; the chat keys
        are there for chat data only, so a journal written before them still resumes)."""
        doc = {**asdict(self), "sources": list(self.sources), "format_version": FORMAT_VERSION}
        del doc["max_document_bytes"]
        if not self.chat:
            for key in CHAT_KEYS:
                del doc[key]
        return doc


CHAT_KEYS = ("chat", "messages_key", "seq_len", "train_on", "pad")


@dataclass(frozen=True)
class Plan:
    request: Request
    inputs: tuple[InputFile, ...]
    tokenizer: dict  # kind, source, sha256, vocab_size (+ file for tokenizers)
    separator: Separator
    dtype: str
    chat: dict | None = None  # the template's sha256 and source, specials, seq_len, masking

    @property
    def vocab_size(self) -> int:
        return self.tokenizer["vocab_size"]

    def record(self) -> dict:
        return {
            "request": self.request.record(),
            "inputs": [f.record() for f in self.inputs],
            "tokenizer": self.tokenizer,
            "separator": self.separator.record(),
            "dtype": self.dtype,
            **({"chat": self.chat} if self.chat else {}),
        }

    @classmethod
    def from_record(cls, doc: dict, request: Request) -> Plan:
        return cls(
            request,
            tuple(InputFile.from_record(f) for f in doc["inputs"]),
            doc["tokenizer"],
            Separator.from_record(doc["separator"]),
            doc["dtype"],
            doc.get("chat"),
        )


def check_request(request: Request) -> None:
    if not 0 <= request.val_fraction < 1:
        raise DataError(f"--val-fraction: must be in [0, 1) (got {request.val_fraction})")
    if request.max_tokens is not None and request.max_tokens < 1:
        raise DataError(f"--max-tokens: must be >= 1 (got {request.max_tokens})")
    if request.max_document_bytes < 1:
        raise DataError(f"--max-document-bytes: must be >= 1 (got {request.max_document_bytes})")
    if request.shard_tokens < 1:
        raise DataError(f"--shard-tokens: must be >= 1 (got {request.shard_tokens})")
    if request.dtype not in ("auto", "uint16", "uint32"):
        raise DataError(f"--dtype: must be auto, uint16 or uint32 (got {request.dtype!r})")
    if request.flat and request.val_fraction:
        raise DataError(
            "--val-fraction: a flat .bin output has no place for a validation part; name an "
            "output folder instead (without .bin)"
        )
    if request.chat:
        _check_chat(request)


def _check_chat(request: Request) -> None:
    from speedtronic.data.ingest.chat import TRAIN_ON

    if request.seq_len is None or request.seq_len < 1:
        got = "" if request.seq_len is None else f" (got {request.seq_len})"
        raise DataError(
            f"--chat: needs --seq-len N, the context the model trains at{got}: each conversation "
            "fills one example of N tokens, cut at a turn that fits"
        )
    if request.train_on not in TRAIN_ON:
        raise DataError(f"--train-on: must be assistant or all (got {request.train_on!r})")
    if request.flat:
        raise DataError("--chat: a flat .bin output has no place for the loss mask; name a folder")
    if request.tokenizer == "byte" or spec.is_hub(request.tokenizer):
        raise DataError(
            f"--chat: --tokenizer {request.tokenizer} has no chat template here; name the "
            "model's tokenizer folder (an imported run, or a folder with tokenizer.json and "
            "tokenizer_config.json)"
        )


def resolve(request: Request, folder: Path, avoid: tuple[str, ...] = ()) -> Plan:
    """Resolve ``request`` into a plan; the tokenizer file lands in ``folder``; globs skip what
    lies under the real paths ``avoid`` (the output's own)."""
    inputs: list[InputFile] = []
    for source in request.sources:
        if spec.is_hub(source):
            from speedtronic.data.ingest.hub_source import hub_inputs

            inputs += hub_inputs(source)
        else:
            inputs += spec.local_inputs(source, avoid)
    tokenizer, impl = _tokenizer(request.tokenizer, folder)
    separator = choose_separator(impl, request.separator, request.tokenizer)
    dtype = request.dtype
    if dtype == "auto":
        dtype = "uint16" if tokenizer["vocab_size"] <= 65536 else "uint32"
    elif dtype == "uint16" and tokenizer["vocab_size"] > 65536:
        raise DataError(
            f"--dtype uint16: the vocabulary has {tokenizer['vocab_size']} ids; use uint32"
        )
    chat = _chat(request, folder, impl) if request.chat else None
    for file in inputs if chat else ():
        if file.format == "text":
            raise DataError(
                f"--chat: {file.name} is plain text; conversations come as JSON Lines or Parquet "
                f"rows with a {request.messages_key!r} field"
            )
    return Plan(request, tuple(inputs), tokenizer, separator, dtype, chat)


def _chat(request: Request, folder: Path, impl: object) -> dict:
    """The chat record: the template (its copy in ``folder``), its specials, the masking."""
    from speedtronic.data.ingest import chat

    template, specials, origin = chat.find_template(chat.tokenizer_folder(Path(request.tokenizer)))
    chat.compile_template(template, origin)  # a template that does not compile: now, once
    dest = folder / chat.TEMPLATE_FILE
    try:
        dest.write_text(template, encoding="utf-8")
    except OSError as exc:
        from speedtronic.data.ingest.writer import cannot_write

        raise cannot_write(dest, exc) from None
    pad = specials.get("pad_token")
    pad_id = impl.token_to_id(pad) if pad else None  # type: ignore[attr-defined]
    return {
        "file": chat.TEMPLATE_FILE,
        "template_sha256": sha256_file(dest),
        "template_from": origin,
        "specials": specials,
        "seq_len": request.seq_len,
        "train_on": request.train_on,
        "messages_key": request.messages_key,
        "pad_id": pad_id or 0,
        "masking": "padded" if request.pad else "packed",
    }


def _tokenizer(setting: str, folder: Path) -> tuple[dict, object]:
    """The tokenizer's record and its ``tokenizers.Tokenizer`` (None for bytes), its file in
    ``folder``."""
    if setting == "byte":
        return {"kind": "byte", "vocab_size": 256}, None
    dest = folder / TOKENIZER_FILE
    if spec.is_hub(setting):
        from speedtronic.data.ingest.hub_source import hub_file

        origin = hub_file(setting, dest)
    else:
        path = Path(setting)
        if path.is_dir():  # a model's tokenizer folder, or an imported run
            from speedtronic.data.ingest.chat import tokenizer_folder

            path = tokenizer_folder(path) / TOKENIZER_FILE
        if not path.is_file():
            raise DataError(f"--tokenizer: file not found: {setting} (or use 'byte')")
        try:
            shutil.copyfile(path, dest)
        except OSError as exc:
            from speedtronic.data.ingest.writer import cannot_write

            raise cannot_write(dest, exc) from None
        origin = {
            "source": str(path),
            "sha256": sha256_file(dest),
            "size_bytes": dest.stat().st_size,
        }
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DataError(
            "--tokenizer: a tokenizer file needs the 'tokenizers' package",
            hint="pip install 'speedtronic[tokenizers]'",
        ) from None
    try:
        impl = Tokenizer.from_file(str(dest))
    except Exception as exc:  # the Rust side raises a plain Exception for a bad file
        raise DataError(f"--tokenizer: {setting} is not a tokenizers JSON file: {exc}") from None
    vocab = impl.get_vocab_size(with_added_tokens=True)
    return {"kind": "tokenizers", "file": TOKENIZER_FILE, "vocab_size": vocab, **origin}, impl


def resumed(doc: dict, request: Request, partial: Path, unread: int) -> Plan:
    """The journal's plan, if ``request`` is the one it was made for and no input it read from
    changed. Inputs from index ``unread`` on were not read yet: one of those that changed (a
    file fixed after an error) is taken as it is now."""
    saved = doc.get("request", {})
    now = request.record()
    for key in now:
        if saved.get(key) != now[key]:
            raise DataError(
                f"the unfinished tokenize in this output was started with {key} = "
                f"{saved.get(key)!r}, not {now[key]!r}; run the same command to continue, or "
                f"remove {partial} to start over"
            )
    plan = Plan.from_record(doc, request)
    inputs = list(plan.inputs)
    for index, before in enumerate(inputs):
        if before.on_hub:
            continue
        try:
            now_file = spec.local_inputs(before.path)[0]
        except DataError:
            now_file = None
        if now_file is not None and index >= unread:
            inputs[index] = now_file
        elif now_file is None or spec.changed(before, now_file):
            raise DataError(
                f"{before.name} changed (or went missing) since this tokenize read from it; "
                f"remove {partial} to start over"
            )
    return Plan(request, tuple(inputs), plan.tokenizer, plan.separator, plan.dtype, plan.chat)


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 23):
            digest.update(block)
    return digest.hexdigest()

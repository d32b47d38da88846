"""Token shards as one token stream: the folder ``speedtronic data tokenize`` writes, for training.

``TokenShardBlocks`` reads a part's shards (``train`` or ``val``, in order) as if they were one
flat token file: block ``k`` is tokens ``[k*T, k*T + T + 1)`` of their concatenation (a block
may span two shards, so no token is dropped at a shard's end), read with ``os.pread`` like
``TokenFileBlocks``. It is map-style, so the seeded ``ResumableSampler`` shuffles, resumes
exactly and splits the blocks across DDP ranks with no overlap, whatever the number of shards.
Every id is checked once against the model's vocabulary at start, as for a flat file. Where
the manifest records each shard's bytes of text, ``bytes_per_token`` turns an evaluation's loss
into bits per byte (issue 53).

``ChatShardBlocks`` reads a chat folder (``data tokenize --chat``): sample ``k`` is its
``k``-th example of ``seq_len + 1`` tokens, the labels ``-100`` where the mask beside the shard
says a token is not trained on; ``data.seq_len`` must be the folder's. A packed folder's
examples hold several conversations: the sample adds ``doc_ids``, per input position the
conversation it belongs to (counted from the mask's start bits), which the model turns into
attention within each conversation and RoPE positions restarting at its start.

``open_token_path`` is what the loader calls for ``data.token_path`` / ``data.eval_path``: a
flat file becomes ``TokenFileBlocks``; a folder is checked through its manifest (a folder
without one is an unfinished tokenize), every file it lists verified against its sha256
(``data.integrity``: cached, so a second start hashes nothing), its dtype agreeing with
``data.token_dtype`` and its tokenizer's vocabulary fitting ``model.vocab_size``.
"""

from __future__ import annotations

import bisect
from pathlib import Path

import numpy as np
import torch

from speedtronic.data import manifest as manifests
from speedtronic.data.ingest.chat import START
from speedtronic.data.ingest.writer import mask_name
from speedtronic.data.integrity import verify_folder
from speedtronic.data.sources import (
    _TOKEN_DTYPES,
    TokenFileBlocks,
    _block,
    _BlockRange,
    _check_file,
    _ProcessFile,
    _read_exact,
    _too_short,
)
from speedtronic.errors import DataError

IGNORE_INDEX = -100  # the label no loss counts (the model's and the trainer's)


class TokenShardBlocks(_BlockRange):
    """Blocks of a sequence of token files read as one; random access across their seams."""

    def __init__(
        self,
        shards: list[tuple[Path, int]],
        seq_len: int,
        dtype: str,
        vocab_size: int | None,
        key: str = "data.token_path",
        name: str = "",
        text_bytes: list[int] | None = None,
    ):
        self.seq_len, self.key, self.name = seq_len, key, name
        self.text_bytes = text_bytes  # UTF-8 bytes of text per shard; None: not recorded
        self.dtype = np.dtype(_TOKEN_DTYPES[dtype])
        self.paths = [Path(p) for p, _ in shards]
        for path, tokens in shards:
            size = _check_file(Path(path), key)
            if size != tokens * self.dtype.itemsize:
                raise DataError(f"{key}: {path} is {size} bytes, not {tokens} {dtype} tokens")
        self.starts = np.cumsum([0] + [t for _, t in shards]).tolist()  # token offsets
        total = self.starts[-1]
        if total < seq_len + 1:
            raise _too_short(key, Path(name or self.paths[0]), f"{total} tokens", seq_len)
        self._files = [_ProcessFile(p, key) for p in self.paths]
        if vocab_size is not None:
            self._check_ids(vocab_size)
        super().__init__((total - 1) // seq_len)

    def _check_ids(self, vocab_size: int) -> None:
        chunk = 1 << 24  # tokens per read: bounded memory for any size
        for shard, path in enumerate(self.paths):
            count = self.starts[shard + 1] - self.starts[shard]
            for start in range(0, count, chunk):
                part = self._read(shard, start, min(chunk, count - start))
                if part.size and part.max() >= vocab_size:
                    at = start + int(np.argmax(part >= vocab_size))
                    raise DataError(
                        f"{self.key}: {path} has token id {int(part[at - start])} at position "
                        f"{at}, but model.vocab_size is {vocab_size}"
                    )

    def _read(self, shard: int, start: int, count: int) -> np.ndarray:
        size = self.dtype.itemsize
        fd = self._files[shard].fd()
        data = _read_exact(fd, count * size, start * size, self.paths[shard], self.key)
        return np.frombuffer(data, dtype=self.dtype)

    def tokens(self, start: int, count: int) -> np.ndarray:
        """``count`` tokens from position ``start`` of the concatenation."""
        pieces, at, end = [], start, start + count
        shard = bisect.bisect_right(self.starts, at) - 1
        while at < end:
            stop = min(end, self.starts[shard + 1])
            pieces.append(self._read(shard, at - self.starts[shard], stop - at))
            at, shard = stop, shard + 1
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        return _block(self.tokens((self.start + index) * self.seq_len, self.seq_len + 1))

    def bytes_per_token(self, tokens: int) -> float | None:
        """Bytes of text per token of the shards that this range's first ``tokens`` tokens
        (what an evaluation reads) lie in. Shards are whole documents, so this is the scored
        text's own rate where those are read whole (a held-out part within ``eval_batches``),
        and the rate of the shards around it otherwise. None where the manifest has no bytes."""
        if self.text_bytes is None or not len(self):
            return None
        blocks = min(len(self), -(-tokens // self.seq_len))
        first, last = self.start * self.seq_len, (self.start + blocks) * self.seq_len
        a = bisect.bisect_right(self.starts, first) - 1
        b = min(bisect.bisect_right(self.starts, last) - 1, len(self.paths) - 1)
        nbytes = sum(self.text_bytes[a : b + 1])
        return nbytes / (self.starts[b + 1] - self.starts[a]) if nbytes else None


class ChatShardBlocks(TokenShardBlocks):
    """A chat folder's examples (``data tokenize --chat``): example ``k`` is slot ``k`` of
    ``seq_len + 1`` tokens, its labels ``-100`` wherever the mask beside the shard says a token
    is not trained on (the prompt, the padding); ``packed``: with ``doc_ids`` too."""

    def __init__(self, shards, seq_len: int, dtype: str, vocab_size, key, name, packed=False):
        super().__init__(shards, seq_len, dtype, vocab_size, key, name)
        self.slot, self.packed = seq_len + 1, packed
        self._masks = [_ProcessFile(p.with_name(mask_name(p.name)), key) for p in self.paths]
        _BlockRange.__init__(self, self.starts[-1] // self.slot)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        at = (self.start + index) * self.slot
        shard = bisect.bisect_right(self.starts, at) - 1  # a slot never spans two shards
        offset = at - self.starts[shard]
        tokens = self._read(shard, offset, self.slot)
        path = self._masks[shard].path
        raw = _read_exact(self._masks[shard].fd(), self.slot, offset, path, self.key)
        bits = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy())
        block = _block(tokens)
        block["labels"] = block["labels"].masked_fill((bits[1:] & 1) == 0, IGNORE_INDEX)
        if self.packed:  # the tail's padding joins the last conversation: it is never a label
            block["doc_ids"] = torch.cumsum((bits[:-1] & START) > 0, 0)
        return block

    def bytes_per_token(self, tokens: int) -> float | None:
        return None  # examples with padding: no text rate to turn a loss into bits per byte


def open_token_path(
    path: str,
    seq_len: int,
    dtype: str,
    vocab_size: int | None,
    key: str,
    part: str = "train",
) -> TokenFileBlocks | TokenShardBlocks:
    """A flat token file or a shard folder's ``part``, checked against the config."""
    from speedtronic.data.ingest.spec import FORMAT_NAMES, corpus_format

    found = corpus_format(path)
    if found is not None:
        raise DataError(
            f"{key}: {path} is {FORMAT_NAMES[found]}, not tokens",
            hint=f"tokenize it first: speedtronic data tokenize {path} tokens (then {key}: tokens)",
        )
    if not manifests.is_shard_dir(path):
        if dtype == "auto":
            dtype = "uint32" if vocab_size and vocab_size > 65536 else "uint16"
        return TokenFileBlocks(path, seq_len, dtype, vocab_size, key=key)
    doc = manifests.read_manifest(path, key)
    verify_folder(path, doc, key)  # before the first step: the bytes are what it promises
    if dtype not in ("auto", doc["dtype"]):
        raise DataError(
            f"data.token_dtype: {dtype}, but {path} holds {doc['dtype']} tokens (set auto)"
        )
    vocab = doc["vocab_size"]
    if vocab_size is not None and vocab_size < vocab:
        raise DataError(
            f"model.vocab_size: {vocab_size} is smaller than the vocabulary of the tokenizer "
            f"{path} was tokenized with ({vocab}); set model.vocab_size: {vocab}"
        )
    shards = manifests.shards(path, doc, part, key)
    if not shards:
        raise DataError(f"{key}: {path} has no {part} part" + (
            "; tokenize with --val-fraction to hold one out" if part == "val" else ""
        ))  # fmt: skip
    chat = doc.get("chat")
    if chat:
        if chat.get("seq_len") != seq_len:
            raise DataError(
                f"data.seq_len: {seq_len}, but {path} holds conversations tokenized with "
                f"--seq-len {chat.get('seq_len')}, one example each; set data.seq_len: "
                f"{chat.get('seq_len')} (or tokenize again with --seq-len {seq_len})"
            )
        packed = chat.get("masking") == "packed"
        name = f"{path} ({part})"
        return ChatShardBlocks(shards, seq_len, doc["dtype"], vocab_size, key, name, packed)
    name, nbytes = f"{path} ({part})", manifests.text_bytes(doc, part)
    return TokenShardBlocks(shards, seq_len, doc["dtype"], vocab_size, key, name, nbytes)

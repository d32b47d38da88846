"""Token shards written so that a kill loses nothing committed and a resume writes the same bytes.

The output is built in ``OUT.partial/``: per part (``train``, ``val``) shards ``train_00000.bin``,
``train_00001.bin``, ... of flat ``uint16`` / ``uint32`` ids; a shard is closed at the first unit
boundary past ``shard_tokens``. ``progress.json`` (the journal) says how far the output is
good: the plan the tokenize started with, the next unit to read, every closed shard (tokens,
sha256, UTF-8 bytes of text) and the length (tokens, text bytes) of each open one, and the
counts so far. A commit fsyncs the open shards, then replaces the journal atomically (write,
fsync, rename, fsync the folder): whatever was written after the last commit is cut off on
resume (``ShardWriter.resume``), and the units after it are read again, so the result is
byte-identical to a run never killed. The text bytes come with each unit's tokens
(``Encoded``), so they are cut back with them: a shard's ``bytes`` is the size of the text its
tokens came from (bits per byte, issue 53); a journal written before they were counted leaves
the open shard's unknown (None, and no ``bytes`` in its record).

Chat data (``--chat``, ``data.ingest.chat``) has a loss mask beside each shard,
``train_00000.mask``: one uint8 per token, written, hashed, synced, cut back on resume and
closed with its shard (its record gains ``mask`` and ``mask_sha256``), so it resumes as exactly.

A write that fails (a full disk, a quota, a file-size limit) is an ``OutputError`` naming the
file (exit 1); the journal is left at its last commit, so a rerun after freeing space continues.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from speedtronic.errors import DataError, OutputError

JOURNAL = "progress.json"
PARTS = ("train", "val")


def shard_name(part: str, index: int) -> str:
    return f"{part}_{index:05d}.bin"


def mask_name(shard: str) -> str:
    """The loss mask beside a chat shard: one uint8 per token, 1 where it is a trained label."""
    return shard[: -len(".bin")] + ".mask"


def cannot_write(path: Path, exc: OSError) -> OutputError:
    """The one line for a failed write: the file, the reason, what to do."""
    return OutputError(
        f"{path}: cannot write ({exc.strerror or exc}); what was committed is kept: free space "
        "(or fix the folder) and run the same command again to continue"
    )


def write_json(path: Path, doc: dict) -> None:
    """``doc`` to ``path`` atomically and durably (a reader sees the old or the new file)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise cannot_write(path, exc) from None
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # not on this platform (Windows)
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass
class Part:
    """One part's shards: those closed (records), and the open one's tokens so far."""

    name: str
    closed: list[dict] = field(default_factory=list)
    open_tokens: int = 0
    open_bytes: int | None = 0  # text bytes of the open shard; None: unknown (an old journal)
    documents: int = 0
    _file: object = None
    _hash: object = None
    _path: Path | None = None
    _mask: object = None  # chat data: the open shard's mask file and its hash
    _mask_hash: object = None

    @property
    def tokens(self) -> int:
        return sum(s["tokens"] for s in self.closed) + self.open_tokens

    def state(self) -> dict:
        return {
            "closed": self.closed,
            "open_tokens": self.open_tokens,
            "open_bytes": self.open_bytes,
            "documents": self.documents,
        }


class ShardWriter:
    """Appends each unit's tokens to the open shard of its part; commits with the journal."""

    def __init__(
        self, root: Path, dtype: str, shard_tokens: int, single: bool = False, masks: bool = False
    ):
        self.root, self.dtype = root, np.dtype(dtype)
        self.shard_tokens, self.single = shard_tokens, single  # single: one train shard, ever
        self.masks = masks  # chat data: a mask file beside each shard, written in step
        self.parts = {name: Part(name) for name in PARTS}

    def resume(self, state: dict | None) -> None:
        """Open the shards where the journal left them (cut to its lengths); no state: fresh."""
        for name, part in self.parts.items():
            saved = (state or {}).get(name, {})
            part.closed = list(saved.get("closed", []))
            part.open_tokens, part.documents = (
                saved.get("open_tokens", 0),
                saved.get("documents", 0),
            )
            part.open_bytes = saved.get("open_bytes", None if part.open_tokens else 0)
            for record in part.closed:
                self._check_closed(record)
            self._open(part)
            stales = [*self.root.glob(f"{name}_*.bin"), *self.root.glob(f"{name}_*.mask")]
            for stale in sorted(stales):
                if int(stale.stem.rpartition("_")[2]) > len(part.closed):
                    stale.unlink()  # written after the last commit: read again

    def _check_closed(self, record: dict) -> None:
        path = self.root / record["file"]
        expected = record["tokens"] * self.dtype.itemsize
        bad = not path.is_file() or path.stat().st_size != expected
        if self.masks:
            mask = self.root / mask_name(record["file"])
            bad = bad or not mask.is_file() or mask.stat().st_size != record["tokens"]
        if bad:
            raise DataError(
                f"{path}: a finished shard is missing or changed since the journal was written; "
                f"remove {self.root} and run the command again"
            )

    def _open(self, part: Part) -> None:
        path = self.root / shard_name(part.name, len(part.closed))
        keep = part.open_tokens * self.dtype.itemsize
        if keep and (not path.is_file() or path.stat().st_size < keep):
            raise DataError(f"{path}: shorter than its journal says; remove {self.root} and rerun")
        part._path = path
        f = open(path, "r+b" if keep else "wb")  # noqa: SIM115 - held open across units
        f.truncate(keep)
        part._hash = hashlib.sha256()
        while f.tell() < keep:  # the hash of what stays (bounded by one shard)
            part._hash.update(f.read(min(1 << 24, keep - f.tell())))
        f.seek(keep)
        part._file = f
        if self.masks:
            part._mask, part._mask_hash = self._open_mask(path, part.open_tokens)

    def _open_mask(self, shard: Path, keep: int) -> tuple[object, object]:
        path = shard.with_name(mask_name(shard.name))
        if keep and (not path.is_file() or path.stat().st_size < keep):
            raise DataError(f"{path}: shorter than its journal says; remove {self.root} and rerun")
        f = open(path, "r+b" if keep else "wb")  # noqa: SIM115 - held open across units
        f.truncate(keep)
        digest = hashlib.sha256(f.read(keep) if keep else b"")  # a byte a token: one shard's
        f.seek(keep)
        return f, digest

    def add(
        self, name: str, tokens: np.ndarray, documents: int, text_bytes: int = 0, mask=None
    ) -> None:
        if not tokens.size and not documents:
            return
        part = self.parts[name]
        data = tokens.astype(self.dtype, copy=False).tobytes()
        try:
            part._file.write(data)
            if self.masks:
                bits = mask.astype(np.uint8, copy=False).tobytes()
                part._mask.write(bits)
        except OSError as exc:
            raise cannot_write(part._path, exc) from None
        part._hash.update(data)
        if self.masks:
            part._mask_hash.update(bits)
        part.open_tokens += tokens.size
        part.documents += documents
        if part.open_bytes is not None:
            part.open_bytes += text_bytes

    def end_unit(self) -> None:
        """A unit boundary: close each shard that has reached ``shard_tokens``."""
        for part in self.parts.values():
            if part.open_tokens >= self.shard_tokens and not (self.single and part.name == "train"):
                self._close(part)
                self._open(part)

    def _close(self, part: Part) -> None:
        self._flush(part)
        part._file.close()
        record = {
            "file": shard_name(part.name, len(part.closed)),
            "tokens": part.open_tokens,
            "sha256": part._hash.hexdigest(),
        }
        if self.masks:
            part._mask.close()
            record["mask"] = mask_name(record["file"])
            record["mask_sha256"] = part._mask_hash.hexdigest()
        if part.open_bytes is not None:
            record["bytes"] = part.open_bytes
        part.closed.append(record)
        part.open_tokens, part.open_bytes = 0, 0

    def sync(self) -> dict:
        """Make the open shards durable; the state a journal records for them."""
        for part in self.parts.values():
            self._flush(part)
        return {name: part.state() for name, part in self.parts.items()}

    def _flush(self, part: Part) -> None:
        try:
            for f in (part._file, part._mask) if self.masks else (part._file,):
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise cannot_write(part._path, exc) from None

    def finish(self) -> dict[str, list[dict]]:
        """Close every open shard that holds tokens (and drop empty ones); the shards per part."""
        out = {}
        for part in self.parts.values():
            if part.open_tokens:
                self._close(part)
            else:
                part._file.close()
                empty = shard_name(part.name, len(part.closed))
                (self.root / empty).unlink(missing_ok=True)
                if self.masks:
                    part._mask.close()
                    (self.root / mask_name(empty)).unlink(missing_ok=True)
            out[part.name] = part.closed
        fsync_dir(self.root)
        return out

    def close(self) -> None:
        for part in self.parts.values():
            for f in (part._file, part._mask):
                if f is not None and not f.closed:
                    f.close()

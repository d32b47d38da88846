"""A token folder held to its manifest's word: each shard's size and sha256, the tokenizer's.

``verify_folder`` runs before a run's first step (the loader opens a folder through it), in
``validate`` and wherever a folder's tokenizer is read. A shard zero-filled at its size, a shard
swapped for a link to other bytes, a manifest whose sha256 was edited, a ``tokenizer.json``
replaced by another of the same size: each is a ``DataError`` naming the file (exit 2).

A link is verified like any other file, wherever it points: the bytes are what the manifest
promises or they are refused; a folder assembled from links to shards on another disk still
trains. Files are hashed on a few helper threads (``hashlib`` releases the GIL), on the calling
thread when a thread cannot start. A verdict is kept per file, keyed by what ``stat`` says of
the bytes the name reaches (device, inode, size, mtime_ns, ctime_ns) and the sha256 promised, in
``verified.json`` beside the manifest (written atomically), or, where the folder cannot be
written (a read-only data disk), in the user cache dir (``speedtronic/verified/``), or else for
this process only. A second start stats the files and hashes nothing. Stdlib only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from speedtronic.errors import DataError

CACHE_FILE = "verified.json"
CACHE_FORMAT = "speedtronic.verified"
MAX_THREADS = 4  # past ~4 readers a disk, not the CPU, is the limit
CHUNK = 1 << 22  # 4 MiB reads: large enough that the GIL-free hash dominates
SHA256 = re.compile(r"[0-9a-f]{64}")
_memory: dict[str, dict] = {}  # folder -> verdicts, where no cache file could be written


@dataclass(frozen=True)
class Expected:
    """One file the manifest promises: its name in the folder, size, sha256, and what it is."""

    name: str
    size: int | None
    sha256: str
    what: str  # "shard" or "tokenizer"


@dataclass
class Verdict:
    """What a verification found: files and bytes checked, and how many were hashed now."""

    files: int = 0
    bytes: int = 0
    hashed_files: int = 0
    hashed_bytes: int = 0
    cache: str = ""  # where the verdicts are kept: a file, or "memory"

    def record(self) -> dict:
        return {
            "verified": True,
            "files": self.files,
            "verified_bytes": self.bytes,
            "hashed_bytes": self.hashed_bytes,
            "cache": self.cache,
        }


def expected_files(folder: Path, doc: dict, key: str) -> list[Expected]:
    """Every file ``doc`` (a manifest already read) promises, with its size and sha256."""
    from speedtronic.data.manifest import ITEMSIZE, MANIFEST

    out, itemsize = [], ITEMSIZE[doc["dtype"]]
    for part in doc["parts"].values():
        for record in part or []:
            digest = record.get("sha256")
            if not isinstance(digest, str) or not SHA256.fullmatch(digest):
                raise DataError(f"{key}: {folder / MANIFEST} lists a bad sha256 in {record!r}")
            out.append(Expected(record["file"], record["tokens"] * itemsize, digest, "shard"))
            if doc.get("chat"):  # chat data: its loss mask (manifest.shards checked the name)
                digest = record.get("mask_sha256")
                if not isinstance(digest, str) or not SHA256.fullmatch(digest):
                    raise DataError(f"{key}: {folder / MANIFEST} lists a bad mask in {record!r}")
                out.append(Expected(record["mask"], record["tokens"], digest, "loss mask"))
    chat = doc.get("chat")
    if isinstance(chat, dict):
        digest = chat.get("template_sha256")
        if chat.get("file") != "chat_template.jinja" or not SHA256.fullmatch(str(digest)):
            raise DataError(f"{key}: {folder / MANIFEST} records a bad chat template")
        out.append(Expected(chat["file"], None, digest, "chat template"))
    tokenizer = doc.get("tokenizer")
    if isinstance(tokenizer, dict) and tokenizer.get("kind") != "byte":
        out.append(_tokenizer_expected(folder, tokenizer, key))
    return out


def _tokenizer_expected(folder: Path, record: dict, key: str) -> Expected:
    from speedtronic.data.manifest import MANIFEST

    name, digest, size = record.get("file", "tokenizer.json"), record.get("sha256"), None
    if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
        raise DataError(f"{key}: {folder / MANIFEST} names a bad tokenizer file {name!r}")
    if not isinstance(digest, str) or not SHA256.fullmatch(digest):
        raise DataError(f"{key}: {folder / MANIFEST} records no valid sha256 for {name}")
    if isinstance(record.get("size_bytes"), int):
        size = record["size_bytes"]
    return Expected(name, size, digest, "tokenizer")


def verify_folder(folder: str | Path, doc: dict, key: str) -> Verdict:
    """Check every file ``doc`` promises in ``folder``; a DataError names the first that lies."""
    folder = Path(folder)
    files = expected_files(folder, doc, key)
    known = _load_verdicts(folder)
    stats = {f.name: _stat(folder, f, key) for f in files}
    todo = [f for f in files if known.get(f.name) != _entry(stats[f.name], f.sha256)]
    try:
        found = hash_files([folder / f.name for f in todo])
    except OSError as exc:  # unreadable since the stat (permissions, an I/O error)
        where = exc.filename or folder
        raise DataError(f"{key}: {where} cannot be read ({exc.strerror or exc})") from None
    for f in todo:
        if found[folder / f.name] != f.sha256:
            raise _mismatch(folder, f, found[folder / f.name], key)
    verdict = Verdict(len(files), sum(s[2] for s in stats.values()), len(todo))
    verdict.hashed_bytes = sum(stats[f.name][2] for f in todo)
    verdicts = {f.name: _entry(stats[f.name], f.sha256) for f in files}
    verdict.cache = _store_verdicts(folder, verdicts) if todo else _where(folder)
    return verdict


def _stat(folder: Path, f: Expected, key: str) -> list[int]:
    """What identifies the bytes ``f.name`` reaches now (through a link, its target's)."""
    path = folder / f.name
    try:
        info = os.stat(path)
    except OSError as exc:
        raise DataError(f"{key}: {f.what} {path} cannot be read ({exc.strerror or exc})") from None
    if f.size is not None and info.st_size != f.size:
        raise DataError(
            f"{key}: {f.what} {path} is {info.st_size} bytes, the manifest says {f.size} bytes; "
            "the folder is damaged: tokenize again"
        )
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def _entry(stat: list[int], digest: str) -> dict:
    return {"stat": stat, "sha256": digest}


def _mismatch(folder: Path, f: Expected, found: str, key: str) -> DataError:
    from speedtronic.data.manifest import MANIFEST

    path = folder / f.name
    link = f" (a link to {os.path.realpath(path)})" if path.is_symlink() else ""
    fix = "the folder is damaged: tokenize again"
    if f.what == "tokenizer":
        fix = "it is not the tokenizer that made these ids: restore it or tokenize again"
    return DataError(
        f"{key}: {f.what} {path}{link} has sha256 {found[:16]}..., but {folder / MANIFEST} "
        f"promises {f.sha256[:16]}...; {fix}"
    )


def sha256_file(path: Path) -> str:
    """The file's sha256, read in large chunks into one buffer (no copies per chunk)."""
    digest, buffer = hashlib.sha256(), bytearray(CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def hash_files(paths: list[Path], threads: int | None = None) -> dict[Path, str]:
    """Each path's sha256, on up to ``threads`` helper threads (default: cores, at most 4)."""
    if threads is None:
        threads = min(MAX_THREADS, os.cpu_count() or 1)
    threads = min(threads, len(paths))
    if threads <= 1:
        return {p: sha256_file(p) for p in paths}
    done: dict[Path, str] = {}
    futures: dict[Path, Future] = {}
    with ThreadPoolExecutor(threads, thread_name_prefix="sha256") as pool:
        for path in paths:
            try:
                futures[path] = pool.submit(sha256_file, path)
            except RuntimeError:  # "can't start new thread": the calling thread does it
                done[path] = sha256_file(path)
        done.update({path: future.result() for path, future in futures.items()})
    return done


def _cache_paths(folder: Path) -> list[Path]:
    """Where verdicts are kept: beside the manifest, else in the user cache dir."""
    from platformdirs import user_cache_dir

    name = hashlib.sha256(os.fsencode(os.path.realpath(folder))).hexdigest()[:32]
    return [folder / CACHE_FILE, Path(user_cache_dir("speedtronic")) / "verified" / f"{name}.json"]


def _load_verdicts(folder: Path) -> dict:
    found = dict(_memory.get(os.path.realpath(folder), {}))
    for path in reversed(_cache_paths(folder)):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("format") == CACHE_FORMAT:
            files = doc.get("files")
            found.update(files if isinstance(files, dict) else {})
    return found


def _store_verdicts(folder: Path, verdicts: dict) -> str:
    """Write the verdicts atomically where that works; say where they went."""
    text = json.dumps({"format": CACHE_FORMAT, "version": 1, "files": verdicts}, indent=1)
    for path in _cache_paths(folder):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
            return str(path)
        except OSError:  # read-only, no space, no permission: the next place, then memory
            _remove(tmp)
    _memory[os.path.realpath(folder)] = verdicts
    return "memory"


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def _where(folder: Path) -> str:
    return next((str(p) for p in _cache_paths(folder) if p.is_file()), "memory")

"""What ``data tokenize`` reads: SOURCE arguments turned into one ordered list of input files.

A SOURCE is a file, a directory (its files of a known format, recursively, in sorted order of
their paths), a glob (``*`` within a path segment, ``**`` across them; matches in sorted order),
or ``hf://datasets/OWNER/NAME[@REVISION][/PATH-OR-GLOB]`` (listed by ``hub_source``). The
format comes from the name: ``.txt`` text, ``.jsonl`` / ``.ndjson`` JSON Lines, the same
``.gz`` or ``.zst`` compressed (``.json.gz`` too), ``.parquet``; a file named on its own with
another suffix is read as text (what ``data.text_path`` accepts); ``with_text_suffixes``
(``--text-suffix .py``) reads a directory's files of other suffixes as text, as the glob
``DIR/**/*.py``. Each real file is read once: ``**`` follows a folder link into a real folder it
has not entered yet, so a link to ``.`` never loops. A glob that matches nothing, a directory
without a known file (naming the glob that reads its commonest suffix) and a missing file are
one-line errors naming them.

Stdlib only: the CLI's checks and the loader's refusal of a ``.jsonl`` as ``data.text_path``
use it without pyarrow or torch.
"""

from __future__ import annotations

import glob
import os
import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import unquote

from speedtronic.errors import DataError

FORMATS = {
    ".txt": "text",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".jsonl.gz": "jsonl.gz",
    ".json.gz": "jsonl.gz",
    ".ndjson.gz": "jsonl.gz",
    ".jsonl.zst": "jsonl.zst",
    ".json.zst": "jsonl.zst",
    ".ndjson.zst": "jsonl.zst",
    ".parquet": "parquet",
}
FORMAT_NAMES = {
    "text": "UTF-8 text",
    "jsonl": "JSON Lines",
    "jsonl.gz": "gzipped JSON Lines",
    "jsonl.zst": "zstd-compressed JSON Lines",
    "parquet": "Parquet",
}
KNOWN = ", ".join(FORMATS)
HF_DATASETS = "hf://datasets/"
_GLOB_CHARS = re.compile(r"[*?\[]")


def file_format(name: str) -> str | None:
    """The format a file name says (longest suffix first), None for an unknown suffix."""
    lower = name.lower()
    for suffix in sorted(FORMATS, key=len, reverse=True):
        if lower.endswith(suffix):
            return FORMATS[suffix]
    return None


def corpus_format(name: str) -> str | None:
    """The format of a corpus file that needs ``data tokenize`` first (not plain text), or None."""
    found = file_format(name)
    return None if found in (None, "text") else found


@dataclass(frozen=True)
class InputFile:
    """One file to read. ``name`` is what messages and the manifest show: the local path, or
    ``hf://datasets/ID@SHA/PATH``; ``path`` is where its bytes are (a Hub file's download)."""

    name: str
    format: str
    size: int
    path: str | None = None
    mtime_ns: int | None = None
    repo: str | None = None
    revision: str | None = None
    repo_path: str | None = None
    sha256: str | None = None
    oid: str | None = None

    @property
    def on_hub(self) -> bool:
        return self.repo is not None

    def record(self) -> dict:
        """What the plan and the manifest keep of it (no local path for a Hub file)."""
        doc = {k: v for k, v in asdict(self).items() if v is not None}
        if self.on_hub:
            doc.pop("path", None)
        doc["size_bytes"] = doc.pop("size")
        return doc

    @classmethod
    def from_record(cls, doc: dict) -> InputFile:
        fields = {k: v for k, v in doc.items() if k != "size_bytes"}
        return cls(size=doc["size_bytes"], **fields)


@dataclass(frozen=True)
class HubSpec:
    """``hf://datasets/OWNER/NAME[@REVISION][/PATH-OR-GLOB]`` taken apart."""

    repo: str
    revision: str
    pattern: str

    @property
    def literal_prefix(self) -> str:
        """The folder to list: the one holding the pattern's part before its first glob
        character (a plain path's parent: it may name a file or a folder)."""
        return _GLOB_CHARS.split(self.pattern, 1)[0].rpartition("/")[0]


def is_hub(source: str) -> bool:
    return source.startswith("hf://")


def is_glob(source: str) -> bool:
    """A local SOURCE read as a glob: glob characters, and no file of that very name."""
    return bool(_GLOB_CHARS.search(source)) and not Path(source).exists()


def parse_hub(source: str) -> HubSpec:
    """A dataset source's repo, revision (default ``main``; ``%2F`` for a slash) and pattern."""
    if not source.startswith(HF_DATASETS):
        raise DataError(
            f"{source}: a Hub source is hf://datasets/OWNER/NAME[@REVISION][/PATH-OR-GLOB] "
            "(model repos hold no corpora; a tokenizer is --tokenizer hf://OWNER/MODEL/FILE)"
        )
    parts = source[len(HF_DATASETS) :].split("/")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise DataError(f"{source}: name the dataset as hf://datasets/OWNER/NAME[/PATH]")
    name, _, revision = parts[1].partition("@")
    pattern = "/".join(p for p in parts[2:] if p)
    if {".", ".."} & set(pattern.split("/")):
        raise DataError(f"{source}: '.' and '..' are not repo paths")
    return HubSpec(check_repo(source, f"{parts[0]}/{name}"), unquote(revision) or "main", pattern)


def check_repo(source: str, repo: str) -> str:
    """``repo`` if the Hub could hold it (its naming rule), else one line naming both."""
    from speedtronic.hub.names import is_hub_repo_id

    if not is_hub_repo_id(repo):
        raise DataError(
            f"{source}: {repo!r} is not a Hub repo id: OWNER and NAME are 1-96 letters, digits, "
            "'_', '.' or '-', starting with a letter or digit, without '..' or '--'"
        )
    return repo


def matches(pattern: str, path: str) -> bool:
    """Glob ``pattern`` against a repo ``path``: ``*`` / ``?`` / ``[...]`` stay within a path
    segment, ``**`` spans any number of them; a pattern without glob characters names a file or
    a folder (everything below it)."""
    if not _GLOB_CHARS.search(pattern):
        return not pattern or path == pattern or path.startswith(pattern.rstrip("/") + "/")
    return _glob_regex(pattern).fullmatch(path) is not None


def _glob_regex(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[" and (close := pattern.find("]", i + 1)) > i:
            out, i = out + "[" + pattern[i + 1 : close].replace("!", "^", 1) + "]", close + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def local_inputs(source: str, avoid: tuple[str, ...] = ()) -> list[InputFile]:
    """The files a local SOURCE names, in order; a one-line DataError when it names none. A
    glob's matches leave out what lies at or under the real paths ``avoid`` (the output's)."""
    path = Path(source)
    if is_glob(source):
        found = [p for p in _glob_files(source) if os.path.isfile(p) and not _under(p, avoid)]
        if not found:
            raise DataError(f"{source}: no file matches this glob")
        return [_local(Path(p), file_format(p) or "text") for p in _once(found)]
    if path.is_dir():
        below = [p for p in _dir_files(path) if file_format(p.name)]
        if not below:
            raise _no_known_file(source, path)
        return [_local(Path(p), file_format(p)) for p in _once([str(p) for p in below])]
    if not path.exists():
        raise DataError(f"{source}: file not found")
    if not path.is_file():
        raise DataError(f"{source}: not a regular file or a directory")
    return [_local(path, file_format(path.name) or "text")]


def _glob_files(source: str) -> list[str]:
    """A glob's matches in sorted order. ``**`` walks the folder below the glob's literal part
    itself: it follows folder links (a corpus may be one) but enters each real folder once, so a
    venv's ``lib64 -> lib`` is read once, under its first name, and a link to ``.`` never loops
    (``glob.glob`` re-entered both, up to 2**40 paths for two links to ``.``)."""
    if "**" not in source:
        return sorted(glob.glob(source))
    root = _GLOB_CHARS.split(source, 1)[0].rpartition("/")[0]
    rest = source[len(root) + 1 :] if root or source.startswith("/") else source
    pattern, dotted = _glob_regex(rest), any(part.startswith(".") for part in rest.split("/"))
    found = []
    for rel in _walk_once(root or ("/" if source.startswith("/") else ".")):
        hidden = any(part.startswith(".") for part in rel.split("/"))
        if pattern.fullmatch(rel) and (dotted or not hidden):  # glob's rule for dot names
            found.append(f"{root}/{rel}" if root or source.startswith("/") else rel)
    return sorted(found)


def _walk_once(root: str):
    """The path relative to ``root`` of every entry below it, following folder links but
    entering each real folder only once (the first name in sorted order wins)."""
    seen = {os.path.realpath(root)}
    for top, dirs, files in os.walk(root, followlinks=True):
        dirs.sort()
        keep = []
        for name in dirs:
            real = os.path.realpath(os.path.join(top, name))
            if real not in seen:
                seen.add(real)
                keep.append(name)
        dirs[:] = keep
        for name in (*keep, *files):
            yield os.path.relpath(os.path.join(top, name), root)


def _once(paths: list[str]) -> list[str]:
    """``paths`` less any whose real file came earlier (a file link beside its target)."""
    seen: set[str] = set()
    out = []
    for path in paths:
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            out.append(path)
    return out


def _dir_files(path: Path) -> list[Path]:
    """A directory's files, recursively, in sorted order, leaving out hidden ones."""
    return sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))


def _no_known_file(source: str, path: Path) -> DataError:
    """The refusal of a directory of no known format, naming the glob and the option that read
    its commonest suffix (``.py``, ``.md``) as text."""
    suffixes = Counter(p.suffix for p in _dir_files(path) if p.suffix)
    text = f"{source}: the directory holds no file of a known format ({KNOWN})"
    if not suffixes:
        return DataError(text)
    common = suffixes.most_common(1)[0][0]
    pattern = os.path.join(glob.escape(source), "**", f"*{common}")
    return DataError(
        f"{text}; to read its {common} files as text, add --text-suffix {common} or name them "
        f"with the glob '{pattern}'"
    )


def with_text_suffixes(sources: tuple[str, ...], suffixes: tuple[str, ...]) -> tuple[str, ...]:
    """``sources`` with each local directory also read for its files ending in ``suffixes``, as
    text (``--text-suffix``): the globs ``DIR/**/*SUFFIX`` follow the directory, which stays
    where it holds files of a known format. Globs, files and Hub sources are left as they are."""
    for suffix in suffixes:
        if not re.fullmatch(r"\.[^/\\*?\[\]]+", suffix) or file_format(suffix):
            raise DataError(
                f"--text-suffix {suffix!r}: must be a file suffix such as .py, not one of a known "
                f"format ({KNOWN})"
            )
    out: list[str] = []
    for source in sources:
        if not suffixes or is_hub(source) or is_glob(source) or not Path(source).is_dir():
            out.append(source)
            continue
        if any(file_format(p.name) for p in _dir_files(Path(source))):
            out.append(source)
        out += [os.path.join(glob.escape(source), "**", f"*{s}") for s in dict.fromkeys(suffixes)]
    return tuple(out)


def _under(path: str, roots: tuple[str, ...]) -> bool:
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def _local(path: Path, fmt: str) -> InputFile:
    info = path.stat()
    return InputFile(str(path), fmt, info.st_size, str(path), info.st_mtime_ns)


def changed(before: InputFile, now: InputFile) -> bool:
    """Whether a local file is not what a tokenize started with (size or modification time)."""
    return (before.size, before.mtime_ns) != (now.size, now.mtime_ns)

"""What ``data tokenize`` owns at OUT, and the one writer of it (DESIGN §5c "owning files").

A tokenize writes four names beside or at OUT, and nothing else: ``OUT`` itself, its staging
folder ``OUT.partial/``, a lock file ``.OUT.lock`` held for the whole run, and for a flat
``.bin`` output a record ``.OUT.tokenize.json`` that lets the same command say "already done".

- **Staging.** ``open_staging`` makes ``OUT.partial`` and puts a marker in it (``MARKER``: the
  run's identity, pid, host, time). A folder of that name without the marker was not made by a
  tokenize: it is refused, naming it, and never emptied or removed (a user's ``corpus.partial/``
  with a thesis in it stays as it is). A journal left by a tokenize older than the marker is
  adopted only when every entry in the folder is a name a tokenize writes.
- **One writer.** ``OutLock`` takes an exclusive ``flock`` on ``.OUT.lock`` (pid and host
  written in it for the refusal's message); the kernel drops it when its process dies, so a
  ``kill -9`` leaves no stale lock to clear. Where ``fcntl`` is missing, the file is created
  with ``O_EXCL`` and a lock whose holder is gone (``speedtronic.liveness``'s rule) is taken over.
- **Sources.** ``check_out`` refuses an OUT that names no new entry (``.``, ``/``, ``''``);
  ``check_sources`` refuses an OUT that is, holds or lies in a source; ``avoid`` lists what a
  glob's matches must leave out (OUT, its staging folder, the lock, the record).

Stdlib only.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import uuid
from pathlib import Path

from speedtronic import liveness
from speedtronic.errors import DataError, OutputError

MARKER = ".speedtronic-tokenize"
_OURS = re.compile(
    r"\A(?:progress\.json(?:\.tmp)?|tokenizer\.json|manifest\.json(?:\.tmp)?|downloads|"
    r"(?:train|val)_\d{5}\.bin)\Z"
)


def staging(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def lock_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.lock")


def record_path(out: Path) -> Path:
    """Where a flat output's record (request, size, modification time) is kept."""
    return out.with_name(f".{out.name}.tokenize.json")


def avoid(out: Path) -> tuple[str, ...]:
    """The real paths a tokenize into ``out`` writes: no source may be or be inside one."""
    names = (out, staging(out), lock_path(out), record_path(out))
    return tuple(os.path.realpath(p) for p in names)


def check_out(out: str | os.PathLike) -> Path:
    """``out`` as a path, if it names an entry a tokenize may create; else a one-line error."""
    text = os.fspath(out)
    path = Path(text)
    if not text.strip() or path.name in ("", ".", "..") or text.rstrip("/").endswith("/.."):
        raise DataError(
            f"OUT {text!r}: name a new folder (e.g. corpus) or a new .bin file, not "
            f"{'an empty name' if not text.strip() else 'an existing directory itself'}"
        )
    return path


def inside(path: str, root: str) -> bool:
    """Whether real path ``path`` is ``root`` or lies below it."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check_sources(sources: tuple[str, ...], out: Path) -> None:
    """Refuse a local SOURCE (not a glob: its matches skip OUT) that OUT is, holds or lies in."""
    from speedtronic.data.ingest.spec import is_glob, is_hub

    own = avoid(out)
    for source in sources:
        if is_hub(source) or is_glob(source) or not os.path.lexists(source):
            continue
        check_input(source, os.path.realpath(source), out, own)


def check_input(name: str, real: str, out: Path, own: tuple[str, ...] | None = None) -> None:
    for mine in own or avoid(out):
        if inside(real, mine) or inside(mine, real):
            how = "is" if real == mine else "holds" if inside(mine, real) else "lies inside"
            raise DataError(
                f"{name}: this source {how} the output {out} (its tokens would be written over "
                "it or read back as text); name an OUT outside the sources"
            )


# -- what is there already ---------------------------------------------------------------------


def already_done(out: Path, request: dict) -> dict | None:
    """The report of a finished run of the same request at ``out``; None to go on; else an
    error. A flat file that is not such a run is replaced as ``cp`` would (a device or FIFO
    never: the rename would replace it)."""
    if not out.exists():
        return None
    if not out.is_file() and not out.is_dir():  # a FIFO, a device: never renamed over
        raise DataError(f"{out} exists and is not a regular file or a folder; name a new one")
    flat = request.get("flat", False)
    if flat and (out.is_symlink() or not out.is_file()):
        raise DataError(f"{out} exists and is not a regular file; name a new file")
    if not flat and out.is_file():
        raise DataError(
            f"{out} is a file; a folder output needs a new name (or end OUT in .bin for one flat "
            "token file)"
        )
    doc = _flat_record(out) if flat else _manifest(out)
    if doc is not None and doc.get("plan", {}).get("request") == request:
        report = {**doc["counts"], "out": str(out), "already_done": True}
        return {**report, "shards": doc["parts"], "hub_calls": 0, "hub_storage_requests": 0}
    if flat:
        return None
    made = _made_otherwise(doc.get("plan", {}).get("request"), request) if doc else ""
    raise DataError(f"{out} exists{made}; remove it or name another output")


def _made_otherwise(saved: object, now: dict) -> str:
    """Which option the finished tokenize at OUT was made with otherwise: what a re-run changed."""
    if not isinstance(saved, dict):
        return ""
    for key in now:
        if saved.get(key) != now[key]:
            return f" and was made with {key} = {saved.get(key)!r}, not {now[key]!r}"
    return ""


def _manifest(out: Path) -> dict | None:
    from speedtronic.data import manifest

    return manifest.read_manifest(out, "OUT") if (out / manifest.MANIFEST).is_file() else None


def record_flat(out: Path, doc: dict) -> None:
    """Keep a flat output's manifest beside it, with the size and time that say it is the same
    file still."""
    info = out.stat()
    entry = {**doc, "file": {"size_bytes": info.st_size, "mtime_ns": info.st_mtime_ns}}
    from speedtronic.data.ingest.writer import write_json

    write_json(record_path(out), entry)


def _flat_record(out: Path) -> dict | None:
    """The record of the flat run that wrote ``out``, if ``out`` is still what it wrote."""
    try:
        doc = json.loads(record_path(out).read_text(encoding="utf-8"))
        info = out.stat()
        same = doc["file"] == {"size_bytes": info.st_size, "mtime_ns": info.st_mtime_ns}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return doc if same else None


# -- the staging folder ------------------------------------------------------------------------


def open_staging(out: Path) -> Path:
    """``OUT.partial``, made and marked now, or found marked (or adopted); a folder of that name
    that a tokenize did not make is refused."""
    partial = staging(out)
    try:
        partial.mkdir()
    except FileExistsError:
        if not (partial / MARKER).is_file():
            _adopt(partial)
        return partial
    except OSError as exc:
        raise OutputError(f"{partial}: cannot create the staging folder ({_reason(exc)})") from None
    _mark(partial)
    return partial


def _mark(partial: Path) -> None:
    doc = {
        "made_by": "speedtronic data tokenize",
        "run": uuid.uuid4().hex,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (partial / MARKER).write_text(json.dumps(doc) + "\n", encoding="utf-8")


def _adopt(partial: Path) -> None:
    """A staging folder without a marker: an older tokenize's unfinished run (a journal and
    only names a tokenize writes) is marked and continued; anything else is refused."""
    if not partial.is_dir() or partial.is_symlink():
        raise DataError(f"{partial} exists and is not a tokenize's staging folder; move it away")
    names = [p.name for p in partial.iterdir()]
    if "progress.json" in names and all(_OURS.match(n) for n in names) and _journal(partial):
        _mark(partial)
        return
    raise DataError(
        f"{partial} exists and was not made by speedtronic data tokenize (no {MARKER} in it); "
        "nothing in it was touched: move it away or name another OUT"
    )


def _journal(partial: Path) -> bool:
    try:
        doc = json.loads((partial / "progress.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "plan" in doc and "next" in doc


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


# -- the lock ----------------------------------------------------------------------------------


class OutLock:
    """An exclusive lock on ``.OUT.lock`` for the run; a second holder is refused at once."""

    def __init__(self, out: Path, command: str = "data tokenize"):
        self.out, self.path, self.command = out, lock_path(out), command
        self._fd: int | None = None

    def __enter__(self) -> OutLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = _flock(self.path) if _fcntl() else _exclusive(self.path)
        except OSError as exc:
            raise OutputError(f"{self.path}: cannot create the lock ({_reason(exc)})") from None
        if self._fd is None:
            raise DataError(
                f"{self.out}: another {self.command} is writing it "
                f"({liveness.holder(self.path)}; lock "
                f"{self.path}); wait for it to end, or name another OUT"
            )
        stamp = liveness.stamp().encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, stamp, 0)
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink()  # while held: a waiter that opened it sees another inode
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None


def _fcntl():
    try:
        import fcntl
    except ImportError:  # Windows
        return None
    return fcntl


def _flock(path: Path) -> int | None:
    """The lock file's descriptor, locked; None when another process holds it."""
    fcntl = _fcntl()
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder removed it as we opened it: lock the new one


def _exclusive(path: Path) -> int | None:
    """Without flock: create the file or find a live holder; a dead holder's file is taken."""
    for _ in range(2):
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if liveness.marker_alive(path):
                return None
            path.unlink(missing_ok=True)
    return None

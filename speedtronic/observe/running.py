"""A run's ``.running`` marker: which process trains in an output directory right now.

``train`` (and a DumbDiLoCo master that only coordinates) claims its output directory before it
changes anything in it: ``check_free`` refuses, in one line naming the pid and host, a directory
whose marker names a live process (``speedtronic.liveness``'s rule), so neither ``--overwrite``
nor ``--resume`` nor a fresh start touches a live run's checkpoints, logs or marker (issue 53).
``claim`` writes this process's marker (``liveness.stamp``) whole or not at all; ``release``
removes it when the run ends however it ends, and only while it is still this process's (with
the folders ``claim`` made, where the run left them empty). A run
killed with -9 leaves it, naming a dead process: ``speedtronic runs`` reads that as interrupted.
Stdlib only.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from speedtronic import liveness
from speedtronic.errors import OutputError

RUNNING_FILE = ".running"


def check_free(directory: Path, key: str = "run.output_dir") -> None:
    """Refuse ``directory`` while its marker names a live process; ``key`` names the place."""
    path = Path(directory) / RUNNING_FILE
    if (path.is_file() or path.is_symlink()) and liveness.marker_alive(path):
        raise OutputError(
            f"{key}: {directory} is in use by a live run ({liveness.holder(path)}, per {path}); "
            "nothing was changed: wait for it to end or stop it, or name another --output-dir "
            f"(if that process is gone, delete {path})"
        )


@dataclass(frozen=True)
class Claim:
    """This process's marker, and the topmost folder ``claim`` made for it (None: it was there):
    a run refused before it wrote anything leaves no empty output directory behind."""

    path: Path
    made: Path | None
    text: str  # what it wrote: the marker is ours while it holds just that


def claim(directory: Path, key: str = "run.output_dir") -> Claim | None:
    """Mark ``directory`` as this process's run; refused (``check_free``) while another live
    process holds it. None when the marker cannot be written: that never fails the run."""
    directory = Path(directory)
    path, made = directory / RUNNING_FILE, _first_missing(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".running.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        text = liveness.stamp()
        tmp.write_text(text, encoding="utf-8")
    except OSError:
        return None
    try:
        try:  # a link is made whole or not at all, and fails where a marker is already
            os.link(tmp, path)
        except OSError:  # a marker is there (or the file system has no hard links)
            check_free(directory, key)  # a dead process's marker is replaced
            os.replace(tmp, path)
    except OSError:
        return None
    finally:
        tmp.unlink(missing_ok=True)
    return Claim(path, made, text)


def release(held: Claim | None) -> None:
    """Remove this process's marker; another process's stays where it is. The folders ``claim``
    made go too, where the run left them empty."""
    if held is None:
        return
    try:
        with held.path.open("rb") as handle:
            mine = handle.read(liveness.MARKER_LIMIT + 1) == held.text.encode()
        if mine:
            held.path.unlink()
    except OSError:
        pass
    folder = held.path.parent
    while held.made is not None and folder.is_relative_to(held.made):
        try:
            folder.rmdir()  # only an empty one
        except OSError:
            return
        folder = folder.parent


def _first_missing(directory: Path) -> Path | None:
    if directory.exists():
        return None
    while not directory.parent.exists() and directory.parent != directory:
        directory = directory.parent
    return directory

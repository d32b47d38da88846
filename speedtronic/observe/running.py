"""A run's ``.running`` marker: which process trains in an output directory right now.

``train`` (and a DumbDiLoCo master that only coordinates) claims its output directory before it
changes anything in it: ``check_free`` refuses, in one line naming the pid and host, a directory
whose marker names a live process (``speedtronic.liveness``'s rule), so neither ``--overwrite``
nor ``--resume`` nor a fresh start touches a live run's checkpoints, logs or marker (issue 53).
``claim`` writes this process's marker (``liveness.stamp``) whole or not at all; ``release``
removes it when the run ends however it ends, and only while it is still this process's. A run
killed with -9 leaves it, naming a dead process: ``speedtronic runs`` reads that as interrupted.
Stdlib only.
"""

from __future__ import annotations

import os
import uuid
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


def claim(directory: Path, key: str = "run.output_dir") -> Path | None:
    """Mark ``directory`` as this process's run; refused (``check_free``) while another live
    process holds it. None when the marker cannot be written: that never fails the run."""
    directory = Path(directory)
    path = directory / RUNNING_FILE
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".running.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        tmp.write_text(liveness.stamp(), encoding="utf-8")
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
    return path


def release(path: Path | None) -> None:
    """Remove this process's marker at ``path``; another process's stays where it is."""
    if path is None:
        return
    try:
        with path.open("rb") as handle:
            mine = handle.read(liveness.MARKER_LIMIT + 1) == liveness.stamp().encode()
        if mine:
            path.unlink()
    except OSError:
        pass

"""Whether the process a marker file names still runs: the one rule that ``train``'s
``.running``, ``speedtronic runs``, ``data tokenize``'s lock and ``import``'s temporary copies
share (issue 53). Stdlib only.

A marker is one line, ``<pid> <host> [<start>]`` (``stamp``): ``start`` is when the process
started as the kernel counts it (Linux: ``/proc/<pid>/stat``'s starttime, clock ticks since
boot), left out where it cannot be read. ``marker_alive`` reads at most ``MARKER_LIMIT`` bytes
of it (a 3 GiB marker costs nothing) and says:

- another host's marker is alive: from here one cannot tell;
- on this host, alive while the pid runs and, where both start times are known, is the same
  process (a pid taken since by an unrelated process is not the marker's writer);
- an empty, oversize or unparsable marker is alive only for ``WRITING_S`` seconds after it was
  last written (its writer may be between creating and filling it), dead after: a kill while
  writing it must not leave a directory "running" forever;
- a marker that cannot be read at all (no permission) is alive: when in doubt, nothing is
  taken from a run that may be live.
"""

from __future__ import annotations

import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

MARKER_LIMIT = 4096  # bytes: a marker is one short line
WRITING_S = 60.0  # an unparsable marker younger than this may be one being written


@dataclass(frozen=True)
class Marker:
    pid: int
    host: str
    start: str | None  # the process's start time, where it could be read

    def words(self) -> str:
        """How a message names the holder: ``pid 123 on host``."""
        return f"pid {self.pid} on {self.host}"


def stamp() -> str:
    """This process's marker line."""
    start = process_start(os.getpid())
    words = [str(os.getpid()), socket.gethostname(), *([start] if start else [])]
    return " ".join(words) + "\n"


def process_start(pid: int) -> str | None:
    """When ``pid`` started, in the kernel's units (Linux), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read(MARKER_LIMIT).decode("ascii", "replace")
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # the command name may hold spaces and ")"
    return fields[19] if len(fields) > 19 and fields[19].isdigit() else None  # field 22


def read_marker(path: str | os.PathLike) -> Marker | None:
    """The marker at ``path``; None when it is empty, oversize or not ``pid host [start]``.
    OSError when it cannot be read."""
    # O_NONBLOCK: a FIFO in a marker's place must not hang the reader
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = handle.read(MARKER_LIMIT + 1)
    words = data.decode("utf-8", "replace").split() if len(data) <= MARKER_LIMIT else []
    if len(words) not in (2, 3) or not words[0].isdigit() or int(words[0]) <= 0:
        return None
    start = words[2] if len(words) == 3 else None
    return Marker(int(words[0]), words[1], start)


def marker_alive(path: str | os.PathLike) -> bool:
    """Whether the process the marker at ``path`` names may still hold it (module docstring)."""
    try:
        marker = read_marker(path)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot read it: when in doubt, it holds
    if marker is None:
        return _recent(Path(path))
    if marker.host != socket.gethostname():
        return True  # another machine's: cannot tell, so it holds
    if not pid_alive(marker.pid):
        return False
    now = process_start(marker.pid)
    return marker.start is None or now is None or now == marker.start


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (anyone's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process: alive
    return True


def holder(path: str | os.PathLike) -> str:
    """The holder the marker at ``path`` names, for a message; ``holder unknown`` if none."""
    try:
        marker = read_marker(path)
    except OSError:
        marker = None
    return marker.words() if marker is not None else "holder unknown"


def _recent(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime < WRITING_S
    except OSError:
        return False

"""A node's sent deltas that no published global includes yet, kept exactly: memory, then disk.

When a node installs a global, it adds back its own deltas the global does not include yet (I2:
``reapply_own_delta``). Each is kept as the very bytes it uploaded, so what the node adds back is
what the master will apply, in every encoding (``codec.decode_own_delta``) and however many are
out: the newest ``MEMORY_RECORDS`` in memory, the ones past them spilled to disk in the node's
output directory (``diloco_in_flight/``, in the delta's precision), up to the
``in_flight_disk_bytes`` budget. Past that the master is far behind: ``room`` says no, and the
uploader holds later inner loops back in its outbox (added up, still exact) until a global
includes some. A global including sequence number n frees every record up to n. The records
go into the node's checkpoint (bytes for those in memory, name and sha256 for those on disk),
so ``--resume`` installs as exactly as the process that sent them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from speedtronic.checkpoint.files import replace_atomically
from speedtronic.distributed.codec import decode_own_delta

MEMORY_RECORDS = 3  # records kept in memory (copies of the weights in the delta's precision)
SPILL_DIR = "diloco_in_flight"
_SPILL_RE = re.compile(r"delta_([0-9]{8,19})\.safetensors")


@dataclass
class Record:
    """One sent delta: its bytes in memory (``data``) or on disk (``name`` in the spill dir)."""

    seq: int
    encoding: str
    size: int
    sha256: str
    data: bytes | None = None
    name: str | None = None


class InFlight:
    """The records, oldest first; ``spill_dir`` None: a temporary directory made on first use."""

    def __init__(self, spill_dir: str | os.PathLike | None, disk_budget_bytes: int, log: Any):
        self.spill_dir = Path(spill_dir) if spill_dir is not None else None
        self.budget = int(disk_budget_bytes)
        self.log = log  # warn(message)
        self.records: list[Record] = []
        # the weights' shapes: int4 / int2 files hold flat packed codes (set by the plug-in)
        self.shapes: dict[str, tuple[int, ...]] | None = None

    def __len__(self) -> int:
        return len(self.records)

    @property
    def spilled_bytes(self) -> int:
        return sum(r.size for r in self.records if r.name is not None)

    def room(self, size: int) -> bool:
        """Whether one more record of ``size`` bytes fits (memory, or disk within budget)."""
        in_memory = sum(r.data is not None for r in self.records)
        return in_memory < MEMORY_RECORDS or self.spilled_bytes + size <= self.budget

    def add(self, seq: int, data: bytes, encoding: str) -> None:
        """Keep an uploaded delta's bytes: in memory while there is room, else on disk (a disk
        that refuses it keeps it in memory: exactness first, the warning names the file)."""
        record = Record(seq, encoding, len(data), hashlib.sha256(data).hexdigest(), data=data)
        if sum(r.data is not None for r in self.records) >= MEMORY_RECORDS:
            self._spill(record)
        self.records.append(record)

    def _spill(self, record: Record) -> None:
        folder = self._folder()
        path = folder / f"delta_{record.seq:08d}.safetensors"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            replace_atomically(path, record.data)
        except OSError as exc:
            self.log(f"diloco: cannot spill delta {record.seq} to {path} ({exc.strerror}); kept "
                     "in memory")  # fmt: skip
            return
        record.data, record.name = None, path.name

    def _folder(self) -> Path:
        if self.spill_dir is None:
            self.spill_dir = Path(tempfile.mkdtemp(prefix="speedtronic-in-flight-"))
        return self.spill_dir

    def held(self, sha256: str) -> bytes | None:
        """The bytes of a sent delta by their sha256, kept in memory (global_dtype deltas: a
        round this node's delta is in needs no download of it); None if not held."""
        for record in list(self.records):  # the uploader thread may add one meanwhile
            if record.sha256 == sha256 and record.data is not None:
                return record.data
        return None

    def drop_through(self, included_seq: int) -> bool:
        """Forget the records a global including ``included_seq`` holds; whether any went."""
        gone = [r for r in self.records if r.seq <= included_seq]
        self.records = [r for r in self.records if r.seq > included_seq]
        for record in gone:
            self._delete(record)
        return bool(gone)

    def after(self, included_seq: int) -> list[dict[str, torch.Tensor]]:
        """The decoded deltas a global including ``included_seq`` lacks (float32, CPU)."""
        return [t for r in self.records if r.seq > included_seq for t in self._decoded(r)]

    def _decoded(self, record: Record) -> list[dict[str, torch.Tensor]]:
        data = record.data
        if data is None:
            path = self._folder() / record.name
            try:
                data = path.read_bytes()
            except OSError as exc:
                data, problem = None, f"cannot be read ({exc.strerror})"
            else:
                ok = hashlib.sha256(data).hexdigest() == record.sha256
                problem = None if ok else "does not match its sha256"
            if problem is not None:
                self.log(f"diloco: in-flight delta {record.seq} at {path} {problem}; an install "
                         "adds it back only once a global includes it")  # fmt: skip
                record.name = None  # said once: the record is gone
                self.records = [r for r in self.records if r is not record]
                return []
        return [decode_own_delta(data, record.encoding, self.shapes)]

    def _delete(self, record: Record) -> None:
        if record.name is not None and self.spill_dir is not None:
            with contextlib.suppress(OSError):
                (self.spill_dir / record.name).unlink()

    def tidy(self) -> None:
        """Delete spilled files no record names (an earlier run's, or one cut short)."""
        if self.spill_dir is None or not self.spill_dir.is_dir():
            return
        named = {r.name for r in self.records if r.name is not None}
        for path in self.spill_dir.iterdir():
            if _SPILL_RE.fullmatch(path.name) and path.name not in named:
                with contextlib.suppress(OSError):
                    path.unlink()

    # ------------------------------------------------------------------ checkpoint state

    def state(self) -> list[list[Any]]:
        return [[r.seq, r.encoding, r.size, r.sha256, r.data, r.name] for r in self.records]

    def load(self, entries: list[Any]) -> None:
        """Records from a checkpoint; older checkpoints held ``[first, last, tensors]``."""
        self.records = []
        for entry in entries:
            if len(entry) == 3:  # an older node's record: its tensors, kept as fp32 bytes
                import safetensors.torch

                tensors = {k: v.float().contiguous() for k, v in entry[2].items()}
                data = safetensors.torch.save(tensors)
                entry = [int(entry[1]), "fp32", len(data), hashlib.sha256(data).hexdigest(),
                         data, None]  # fmt: skip
            seq, encoding, size, sha, data, name = entry
            self.records.append(Record(int(seq), encoding, int(size), sha, data, name))

"""The state one bench run shares between its stages, and how stages report progress.

This module owns ``BenchContext``: the loaded config and options, the resolved device and
precision modes, the matmul dtypes to measure, the scratch directory, the document being built
(``doc``, one section per stage) and the progress reporting: numbered ``stage_start`` /
``stage_end`` events and de-duplicated warnings, as ``(event, payload)`` pairs for the CLI to
render. The stages themselves live in ``modes``, ``sections`` and ``run``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from speedtronic.bench.options import BenchOptions
from speedtronic.bench.probes import device_facts, matmul_dtypes, supported_modes
from speedtronic.config import SpeedtronicConfig
from speedtronic.train.precision import resolve_device, resolve_precision

SCHEMA_VERSION = 1
Progress = Callable[[str, dict[str, Any]], None]
# Stages besides one per matmul dtype and one per precision mode: device facts, checkpoint,
# data loader, memory copy (and torch.compile when the config turns it on).
FIXED_STAGES = 4


class BenchContext:
    """One bench run's inputs, resolved device facts, document so far and progress reporting."""

    def __init__(self, config: SpeedtronicConfig, options: BenchOptions, progress: Progress | None):
        self.config, self.options = config, options
        self.progress = progress or (lambda event, payload: None)
        self.device = resolve_device(config.run.device)
        self.facts = device_facts(self.device)
        self.configured = resolve_precision(config.precision.mode, self.device, self.warn).mode
        self.modes = [self.configured] + [
            m for m in supported_modes(self.device) if m != self.configured
        ]
        self.dtypes = matmul_dtypes(self.device, self.facts["capabilities"])
        self.doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "quick": options.quick}
        self._warned: set[str] = set()
        self._stage_index = 0
        self._stages = len(self.dtypes) + len(self.modes) + FIXED_STAGES + int(config.compile)
        self.scratch = Path(tempfile.gettempdir())

    def stage(self, label: str, work: Callable[[], Any]) -> Any:
        """Run ``work`` as the next numbered stage, reporting its start and its duration."""
        self._stage_index += 1
        where = {"index": self._stage_index, "total": self._stages, "label": label}
        self.progress("stage_start", where)
        start = time.perf_counter()
        result = work()
        self.progress("stage_end", {**where, "seconds": time.perf_counter() - start})
        return result

    def warn(self, message: str) -> None:
        if message not in self._warned:  # every runtime build repeats its warnings
            self._warned.add(message)
            self.progress("warning", {"message": message})

    def notice(self, message: str) -> None:
        self.progress("notice", {"message": message})

    def configured_row(self) -> dict[str, Any]:
        """The configured precision mode's model measurement (the baseline of later stages)."""
        return self.doc["model"]["modes"][self.configured]

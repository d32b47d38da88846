"""A node's view of the published global: the poller thread that downloads and validates it.

``GlobalFetcher.refresh`` reads ``step_count.json`` and, when it names an outer step newer than
the one installed and the one waiting, downloads ``global/latest.safetensors``, validates it
(``codec``: keys, shapes, dtypes, finiteness, a norm within 10x of the previous global's) and
keeps it as ``ready`` for the plug-in to install. A step count and weights that disagree are a
publish in flight: skipped until the next poll. Every failure is logged and the last good
global kept (I5); a permanent one stops the node through its ``NodeStatus``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from speedtronic.distributed.codec import (
    check_plausible_global,
    decode_weights,
    expected_delta_bytes,
    global_norm,
)
from speedtronic.distributed.node_status import NodeStatus, Throttle
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS


@dataclass(frozen=True)
class Ready:
    """A downloaded, validated global: its outer step and weights, the fleet's tokens per step
    (for ``reapply_own_delta``) and this node's latest sequence number it includes."""

    outer_step: int
    weights: dict[str, torch.Tensor]
    fleet_rate: int
    own_seq: int = -1


class GlobalFetcher:
    """Downloads newer globals into ``ready``; one refresh at a time (poller, boundary wait)."""

    def __init__(self, config: Any, transport: Any, logger: Any, status: NodeStatus, params: dict):
        self.config, self.transport, self.logger, self.status = config, transport, logger, status
        self.node_id: str = config.node_id
        self.params = params  # the reference for keys and shapes
        self.installed_step = -1  # the outer step of the global the node's base came from
        self.ready: Ready | None = None  # a validated global newer than the installed one
        self.norm: float | None = None  # the last accepted global's L2 norm (I4 plausibility)
        self.lock = threading.Lock()
        self._fetching = threading.Lock()
        self.throttle = Throttle()  # the same failure at every poll: one line a minute

    def run(self) -> None:
        """The poller thread."""
        while not self.status.stop.is_set():
            self.refresh()
            self.status.stop.wait(self.config.poll_interval)

    def refresh(self) -> None:
        """Download and validate a newer global, to be installed by the plug-in."""
        try:
            with self._fetching:
                self.fetch_newer()
        except Exception as exc:  # anything: the poller thread must outlive it (I5)
            self.status.stop_if_permanent(exc)
            line = self.throttle.line(f"diloco: could not fetch the global weights ({exc})")
            if line:
                self.logger.warn(line)

    def take(self) -> Ready | None:
        """The waiting global, if any, and forget it (the caller installs it or drops it)."""
        with self.lock:
            ready, self.ready = self.ready, None
        return ready

    def fetch_newer(self) -> None:
        counted = self.transport.read_step_count()
        with self.lock:
            known = max(self.installed_step, self.ready.outer_step if self.ready else -1)
        if counted is None or counted["outer_step"] <= known:
            return
        data = self.transport.read(GLOBAL_WEIGHTS, self._max_weight_bytes())
        if data is None:
            return
        outer_step, weights = decode_weights(data, self.params)
        self.status.counters["bytes_down"] += len(data)
        if outer_step != counted["outer_step"]:
            return  # a publish in flight: step_count and weights disagree until it ends
        if self.norm is None:  # the first global: against this node's own initial weights
            self.norm = global_norm(self.params)
        check_plausible_global(weights, self.norm)
        self.norm = global_norm(weights)
        own_seq = ((counted.get("nodes") or {}).get(self.node_id) or {}).get("seq", -1)
        with self.lock:  # never replace a newer global already waiting
            if outer_step > (self.ready.outer_step if self.ready else self.installed_step):
                rate = counted.get("fleet_tokens_per_step", 0)
                self.ready = Ready(outer_step, weights, rate, own_seq)

    def _max_weight_bytes(self) -> int:
        return expected_delta_bytes(self.params, "fp32") + (1 << 20)

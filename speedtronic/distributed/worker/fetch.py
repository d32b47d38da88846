"""A node's view of the published global: the poller thread that downloads and validates it.

``GlobalFetcher.refresh`` reads ``step_count.json`` and, when it names an outer step newer than
the one installed and the one waiting, downloads ``global/latest.safetensors`` (and the keyframe
an update builds on, once: ``global_update``), validates it (``codec``: keys, shapes, dtypes,
finiteness, a norm within 10x of this node's own weights at start plus how far its own training
moved them) and keeps it as ``ready`` for the plug-in to install. A step count and weights that
disagree are a publish in flight: skipped until the next poll. Every failure is logged and the
last good global kept (I5); a permanent one stops the node through its ``NodeStatus``. A
global it failed to read is remembered (``unread``): a node with none installed then holds its
deltas back until it reads one (``WorkerPlugin.boundary``), as does a resumed node until it
has read a global newer than its checkpoint's.

The repo is untrusted: a writer may publish a global under a step far ahead of the master's.
A master never goes back (I3), so a step count below the step installed means one of the two
was not the master's publish: the node follows the repo's (``Ready.replaces``), and is back on
the master's trajectory once the master has republished its own. The norm bound is against a
fixed anchor and this node's own travel, never the previous global: a bound against each step
before compounds (a global grown 9x per publish passes a 10x check every time).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from speedtronic.distributed.codec import (
    check_plausible_global,
    expected_delta_bytes,
    global_norm,
)
from speedtronic.distributed.frozen_base import check_base
from speedtronic.distributed.global_update import GlobalReader
from speedtronic.distributed.node_status import NodeStatus, Throttle
from speedtronic.distributed.protocol import STEP_COUNT, run_ended


@dataclass(frozen=True)
class Ready:
    """A downloaded, validated global: its outer step and weights, the fleet's tokens per step
    (for ``reapply_own_delta``) and this node's latest sequence number it includes."""

    outer_step: int
    weights: dict[str, torch.Tensor]
    fleet_rate: int
    own_seq: int = -1
    replaces: bool = False  # at or below the installed step: the repo went back, follow it
    nodes: dict = field(default_factory=dict)  # step_count's summary of the fleet (I6 facts)
    # the master's weights themselves (full weights, or an update on a keyframe of this very
    # step, or rounds replayed to the record's sha256); False: an int8 / int4 update, within a
    # quantization step of them (worker/end)
    exact: bool = True
    ended: bool = False  # the step count says the master has ended the run (``run_ended``)


class GlobalFetcher:
    """Downloads newer globals into ``ready``; one refresh at a time (poller, boundary wait)."""

    def __init__(
        self,
        config: Any,
        transport: Any,
        logger: Any,
        status: NodeStatus,
        params: dict,
        base_sha256: str | None = None,
    ):
        """``base_sha256``: the frozen base this node trains on (``frozen_base``), checked
        against the run's at every read of the step count."""
        self.config, self.transport, self.logger, self.status = config, transport, logger, status
        self.node_id: str = config.node_id
        self.params = params  # the reference for keys and shapes
        self.base_sha256 = base_sha256
        self.reader = GlobalReader(transport, params)  # keeps the keyframe updates build on
        self.installed_step = -1  # the outer step of the global the node's base came from
        # a published outer step this node failed to read (or refused): its base is then no
        # global of the run, and until one is installed its deltas wait (``unread_global``)
        self.unread: int | None = None
        # A resumed node that could not read the newest global at its start (``resume.catch_up``):
        # its deltas on this base or an older one wait, as the run most likely moved past it
        self.behind_base: int | None = None
        self.ready: Ready | None = None  # a validated global newer than the installed one
        # I4 plausibility: every global's L2 norm is within 10x of this node's own weights at
        # start, plus how far its own training has moved them since (codec). Neither follows
        # the globals, so a writer's globals cannot raise the bound; both go into checkpoints
        self.anchor_norm: float | None = None
        self.travel = 0.0
        self._moved: list[torch.Tensor] = []  # delta norms from boundaries, summed here
        self.lock = threading.Lock()
        self._fetching = threading.Lock()
        self.throttle = Throttle()  # the same failure at every poll: one line a minute
        self._rounds_counted: dict[str, int] = {}  # the replayer's counts already added

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
        finally:
            self._count_rounds()

    def _count_rounds(self) -> None:
        """global_dtype deltas: rounds replayed, refused and disagreeing join the node's
        counters (added, so a resumed node's counts from its checkpoint carry on)."""
        counts = dict(self.reader.replayer.counts)
        for key, value in counts.items():
            if value > self._rounds_counted.get(key, 0):
                added = value - self._rounds_counted.get(key, 0)
                self.status.counters[key] = self.status.counters.get(key, 0) + added
        self._rounds_counted = counts

    def take(self) -> Ready | None:
        """The waiting global, if any, and forget it (the caller installs it or drops it)."""
        with self.lock:
            ready, self.ready = self.ready, None
        return ready

    def fetch_newer(self) -> None:
        self.fetch_counted(self.transport.read_step_count())

    def fetch_counted(self, counted: dict | None) -> None:
        """``fetch_newer`` with the step count already read (``counted``; None: no global)."""
        if counted is not None:  # a node on another frozen base: refused, permanently
            check_base(counted, self.base_sha256, self.transport.describe())
        with self.lock:
            installed, waiting = self.installed_step, self._waiting_step()
        if counted is None or counted["outer_step"] in (installed, waiting):
            return
        try:
            self._read_newer(counted, installed, waiting)
        except Exception:
            with self.lock:
                self.unread = counted["outer_step"]
            raise

    def _read_newer(self, counted: dict, installed: int, waiting: int) -> None:
        """Download and validate the global ``counted`` names, and keep it as ``ready``."""
        # below what the node trains from: the repo went back (a waiting global newer than the
        # repo's is kept: a slower read must not replace it; installed, it is compared here)
        went_back = counted["outer_step"] < installed
        if counted["outer_step"] < waiting and not went_back:
            return
        read = self.reader.read(self._max_weight_bytes())
        if read is None:
            return
        outer_step, weights = read.outer_step, read.weights
        self.status.counters["bytes_down"] += read.bytes_read
        if outer_step != counted["outer_step"]:
            return  # a publish in flight: step_count and weights disagree until it ends
        if self.anchor_norm is None:  # the node's own weights, before any global
            self.anchor_norm = global_norm(self.params)
        anchor = "this node's own weights at start"
        check_plausible_global(weights, self.anchor_norm, anchor, self.travelled())
        own_seq = ((counted.get("nodes") or {}).get(self.node_id) or {}).get("seq", -1)
        rate = counted.get("fleet_tokens_per_step", 0)
        nodes = counted.get("nodes") or {}
        # global/keyframes/<step>-<sha16>.safetensors: an update on a keyframe of its own step
        exact = (
            read.keyframe is None
            or read.replayed
            or int(read.keyframe.rsplit("/", 1)[1].split("-")[0]) == outer_step
        )
        ended = run_ended(counted)
        ready = Ready(outer_step, weights, rate, own_seq, went_back, nodes, exact, ended)
        with self.lock:  # never replace a newer global already waiting, unless the repo went back
            if went_back or outer_step > max(self.installed_step, self._waiting_step()):
                self.ready = ready
        if went_back:
            self.logger.warn(
                f"diloco: {STEP_COUNT} went back from outer step {installed} to {outer_step}; a "
                "master never goes back, so one of them was not its publish: following the "
                "repo (a master restores its own within a minute)"
            )

    def unread_global(self, base_outer_step: int) -> bool:
        """Whether this node's deltas should wait for a global: it has none for its base
        (``base_outer_step`` < 0) though the run has one it failed to read (a lost keyframe, a
        damaged file), or it resumed and has not read the run's newest one yet."""
        with self.lock:
            if self.behind_base is not None and base_outer_step <= self.behind_base:
                return True
            return base_outer_step < 0 and self.unread is not None

    def moved(self, delta: dict[str, torch.Tensor]) -> None:
        """A boundary's delta (the training thread): its norm joins the travel, computed where
        the delta lives and read in the poller thread, so the training thread never waits."""
        if not delta:
            return
        with torch.no_grad():
            norms = torch.stack([torch.linalg.vector_norm(t.float()) for t in delta.values()])
            norm = torch.linalg.vector_norm(norms)
        with self.lock:
            self._moved.append(norm)

    def travelled(self) -> float:
        """How far this node's own training has moved its weights: its deltas' norms, added."""
        with self.lock:  # the poller and a checkpoint (the training thread) may both ask
            self.travel += sum(float(norm) for norm in self._moved)
            self._moved = []
            return self.travel

    def _waiting_step(self) -> int:
        return self.ready.outer_step if self.ready else -1

    def _max_weight_bytes(self) -> int:
        return expected_delta_bytes(self.params, "fp32") + (1 << 20)

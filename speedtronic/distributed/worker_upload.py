"""A node's outbox and its uploader thread: deltas go out in order, none is lost or sent twice.

A boundary queues a ``Pending`` delta; the uploader thread encodes and uploads it. A failed
upload that did not land goes back into the outbox, where later deltas are added to it
(``fold``: cumulative, never lost, I2); one that may have landed (its answer lost) is kept as
``exact`` and only ever resent byte for byte, under the same name, so the master counts it once
(I1). Sequence numbers start past every one the node used. The outbox is part of the node's
checkpoint (``state_dict``), so ``--resume`` resends exactly what was unsent.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import torch

from speedtronic.distributed.codec import encode_delta
from speedtronic.distributed.node_status import NodeStatus
from speedtronic.distributed.protocol import (
    STEP_COUNT,
    DeltaHeader,
    delta_path,
    leaves_room,
    parse_delta_path,
)

RETRY_S = (1.0, 60.0)  # upload retry backoff: first wait, cap
# Sent deltas kept (on the CPU) until a global names them included; past this many, the oldest
# two are merged (a paused master: memory stays at this many copies of the weights)
MAX_IN_FLIGHT = 3


@dataclass
class Pending:
    """A delta waiting for upload; deltas that could not be sent yet are added into it.

    ``seq`` and ``created_at`` are given at its first upload attempt (0 and "" before) and kept
    from then on, so sending it again after a resume sends the very same bytes under the same
    name, which the master counts once (I1).
    """

    delta: dict[str, torch.Tensor]
    base_outer_step: int
    steps: int
    tokens: int
    seq: int = 0
    created_at: str = ""


@dataclass(frozen=True)
class InFlight:
    """Sent deltas ``first``..``last`` (summed) that no published global includes yet."""

    first: int
    last: int
    delta: dict[str, torch.Tensor]

    def after(self, included_seq: int) -> InFlight | None:
        """What a global including seq ``included_seq`` still lacks of these: all, none, or,
        of a merged run cut in the middle, its share by count (merged deltas are alike)."""
        if self.last <= included_seq:
            return None
        if self.first > included_seq:
            return self
        share = (self.last - included_seq) / (self.last - self.first + 1)
        return InFlight(included_seq + 1, self.last, {k: v * share for k, v in self.delta.items()})


class Uploader:
    """The outbox, the delta in flight, the one that may have landed, and the thread sending."""

    def __init__(self, config: Any, transport: Any, logger: Any, status: NodeStatus):
        self.config, self.transport, self.logger, self.status = config, transport, logger, status
        self.node_id: str = config.node_id
        # This process's chain of increments: the master adds up one chain's deltas (a
        # checkpoint keeps it, so --resume continues the chain; a fresh start is a new one)
        self.chain = secrets.token_hex(8)
        self.seq = 0  # the last sequence number given
        self.outbox: Pending | None = None
        self.sending: Pending | None = None  # the delta the uploader holds right now
        self.exact: Pending | None = None  # may have landed: only these bytes may go again
        self.in_flight: list[InFlight] = []  # sent, not yet in a published global; oldest first
        self.upload_seconds: list[float] = []  # how long each upload took, for the poll advice
        self.lock = threading.Lock()
        self.wake = threading.Event()

    def number_past_used(self) -> None:
        """New names start past every one this node used, also after a checkpoint: its deltas
        in the repo and its newest the master applied. A reused name could be deleted unread
        by a master consuming the old file there (I1)."""
        try:
            refs = self.transport.list_deltas()
            counted = self.transport.read_step_count() or {}
        except Exception as exc:  # any transport failure: number on from the checkpoint
            if getattr(exc, "permanent", False):
                raise
            self.logger.warn(f"diloco: cannot list the repo ({exc}); numbering from {self.seq}")
            return
        applied = ((counted.get("nodes") or {}).get(self.node_id) or {}).get("seq")
        if applied is not None and not leaves_room(applied):  # a writer's, not the master's
            self.logger.warn(
                f"diloco: {STEP_COUNT} says this node's newest applied delta is {applied}, "
                "which leaves no room to number on (18 digits); ignored"
            )
            applied = None
        mine = [parse_delta_path(r.path) for r in refs if r.problem is None]
        used = [
            seq for node, seq in filter(None, mine) if node == self.node_id and leaves_room(seq)
        ]
        self.seq = max([self.seq, *used, *([applied] if applied is not None else [])])

    def queue(self, pending: Pending) -> None:
        with self.lock:
            self.outbox = pending if self.outbox is None else fold(self.outbox, pending)
        self.wake.set()

    def all_sent(self) -> bool:
        with self.lock:
            return self.outbox is None and self.sending is None and self.exact is None

    def unsent(self) -> bool:
        with self.lock:
            return self.outbox is not None or self.exact is not None

    def run(self) -> None:
        """The uploader thread: send on each wake-up; after a failure back off and retry."""
        wait, stop = RETRY_S[0], self.status.stop
        while not stop.is_set():
            self.wake.wait()
            self.wake.clear()
            if self.send_pending():
                wait = RETRY_S[0]
            if self.unsent() and not stop.is_set():
                stop.wait(wait)  # a failure: back off, then try again with what piled up
                wait = min(wait * 2, RETRY_S[1])
                self.wake.set()

    def send_pending(self) -> bool:
        """Upload whatever is queued; True if nothing is left to send afterwards."""
        while self._take_and_send():
            pass
        return not self.unsent()

    def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` for queued deltas to go out; what stays is kept in the state."""
        deadline = time.monotonic() + timeout
        self.wake.set()
        while time.monotonic() < deadline and self.status.fatal is None:
            if self.all_sent():
                return
            time.sleep(0.05)
        self.logger.warn("diloco: deltas still unsent at the end; they are in the checkpoint")

    def _take_and_send(self) -> bool:
        """Send the outbox; True on success. A failed delta goes back, folded with later ones.

        Transports raise only when the file did not land, so folding cannot count it twice.
        """
        pending, was_exact = self._take()
        if pending is None:
            return False
        seq, header = pending.seq, self._header(pending)
        try:
            data = encode_delta(pending.delta, header)
            start = time.monotonic()
            self.transport.upload(delta_path(self.node_id, seq), data)
            self.upload_seconds.append(time.monotonic() - start)
        except Exception as exc:  # anything: the uploader thread must outlive it (I5)
            self._failed(pending, was_exact, exc)
            return False
        with self.lock:
            self.sending = None
            self._keep_in_flight(seq, pending.delta)
        counters = self.status.counters
        counters["uploads"] += 1
        counters["bytes_up"] += len(data)
        self.logger.log("diloco_upload", {"seq": seq, "bytes": len(data), "steps": header.steps})
        return True

    def _take(self) -> tuple[Pending | None, bool]:
        """The delta to send next (the exact one first: it may have landed) and whether exact."""
        with self.lock:
            was_exact = self.exact is not None
            if was_exact:
                pending, self.exact = self.exact, None
            elif self.outbox is not None:
                pending, self.outbox = self.outbox, None
            else:
                return None, False
            if not pending.seq:  # its name and time, fixed from its first attempt on
                self.seq += 1
                stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
                pending = replace(pending, seq=self.seq, created_at=stamp)
            self.sending = pending
        return pending, was_exact

    def _failed(self, pending: Pending, was_exact: bool, exc: Exception) -> None:
        self.status.counters["upload_failures"] += 1
        self.status.stop_if_permanent(exc)
        if self.status.fatal is None:
            self.logger.warn(f"diloco: upload of delta {pending.seq} failed ({exc}); will retry")
        with self.lock:
            self.sending = None
            if was_exact or getattr(exc, "maybe_landed", False):
                self.exact = pending  # resent as is: the master counts it once
            else:  # nothing landed: the name is still free for the sum with later ones
                self.outbox = pending if self.outbox is None else fold(pending, self.outbox)

    def _keep_in_flight(self, seq: int, delta: dict[str, torch.Tensor]) -> None:
        # Kept as the master will apply it: in the upload's precision (half the memory in bf16)
        dtype = torch.float32 if self.config.delta_dtype == "fp32" else torch.bfloat16
        kept = {k: v.detach().to("cpu", dtype, copy=True) for k, v in delta.items()}
        self.in_flight.append(InFlight(seq, seq, kept))
        if len(self.in_flight) > MAX_IN_FLIGHT:  # the master is not keeping up: merge the oldest
            older, newer = self.in_flight[:2]
            merged = {k: older.delta[k] + newer.delta[k] for k in older.delta}
            self.in_flight[:2] = [InFlight(older.first, newer.last, merged)]

    def not_included(self, included_seq: int) -> dict[str, torch.Tensor] | None:
        """The sum of every delta of this node that a global including its deltas up to
        ``included_seq`` lacks: sent later, being sent, or not sent yet (CPU, fp32)."""
        with self.lock:
            self.in_flight = [b.after(included_seq) for b in self.in_flight]
            self.in_flight = [b for b in self.in_flight if b is not None]
            parts = [b.delta for b in self.in_flight]
            unsent = (self.exact, self.sending, self.outbox)  # may have landed: by their seq
            parts += [p.delta for p in unsent if p is not None and not 0 < p.seq <= included_seq]
            if not parts:
                return None
            return {
                k: sum(part[k].detach().to("cpu", torch.float32) for part in parts)
                for k in parts[0]
            }

    def _header(self, pending: Pending) -> DeltaHeader:
        return DeltaHeader(
            node_id=self.node_id,
            seq=pending.seq,
            base_outer_step=max(pending.base_outer_step, 0),
            steps=pending.steps,
            tokens=pending.tokens,
            encoding=self.config.delta_dtype,
            created_at=pending.created_at,
            chain=self.chain,
        )

    # ------------------------------------------------------------------ checkpoint state

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            # A delta being sent now may land after this state is saved: it is kept as "exact",
            # to be sent again unchanged after a resume, which the master then counts once.
            unsent, exact = self.outbox, self.exact or self.sending
            return {
                "chain": self.chain,
                "in_flight": [[b.first, b.last, dict(b.delta)] for b in self.in_flight],
                "seq": self.seq,
                "unsent": None if unsent is None else pending_state(unsent),
                "exact": None if exact is None else pending_state(exact),
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.chain = state.get("chain", self.chain)  # older checkpoints: a new chain
        self.in_flight = [InFlight(int(a), int(b), d) for a, b, d in state.get("in_flight", [])]
        self.seq = int(state["seq"])
        unsent, exact = state.get("unsent"), state.get("exact")
        self.outbox = None if unsent is None else Pending(**unsent)
        self.exact = None if exact is None else Pending(**exact)


def fold(first: Pending, later: Pending) -> Pending:
    """One delta for two consecutive inner loops: sums, with the older base (more stale)."""
    delta = {k: first.delta[k] + later.delta[k] for k in first.delta}
    return replace(
        first,
        delta=delta,
        base_outer_step=min(first.base_outer_step, later.base_outer_step),
        steps=first.steps + later.steps,
        tokens=first.tokens + later.tokens,
    )


def pending_state(pending: Pending) -> dict[str, Any]:
    return {
        "delta": {k: v.cpu() for k, v in pending.delta.items()},
        "base_outer_step": pending.base_outer_step,
        "steps": pending.steps,
        "tokens": pending.tokens,
        "seq": pending.seq,
        "created_at": pending.created_at,
    }

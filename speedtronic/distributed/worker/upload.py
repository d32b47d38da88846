"""A node's outbox and its uploader thread: deltas go out in order, none is lost or sent twice.

A boundary queues a ``Pending`` delta; the uploader thread encodes and uploads it. A failed
upload that did not land goes back into the outbox, where later deltas are added to it
(``fold``: cumulative, never lost, I2); one that may have landed (its answer lost) is kept as
``exact`` and only ever resent byte for byte, under the same name, so the master counts it once
(I1). Sequence numbers start past every one the node used. Every sent delta is kept, exactly,
until a global includes it (``worker/inflight``); past its disk budget later inner loops wait
in the outbox. The last delta of a run says so (``final``; an end marker of 0 steps when the run
ended with everything sent). The outbox is part of the node's checkpoint (``state_dict``), so
``--resume`` resends exactly what was unsent, and never an inner loop that the process it
resumes sent after its checkpoint (``skip_replayed``, I1). A delta is encoded when it is sent,
with the error-feedback residual added (``worker/feedback``): folding adds raw deltas, and the
residual, like the outbox, is in the checkpoint.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from speedtronic.distributed.codec import encode_delta
from speedtronic.distributed.node_status import NodeStatus
from speedtronic.distributed.protocol import DeltaHeader, delta_path
from speedtronic.distributed.worker.feedback import ErrorFeedback
from speedtronic.distributed.worker.inflight import InFlight
from speedtronic.distributed.worker.resume import (
    Announcement,
    number_past_used,
    settled,
)

RETRY_S = (1.0, 60.0)  # upload retry backoff: first wait, cap


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
    final: bool = False  # the node's last delta of its run
    end_step: int = 0  # the node's optimizer step at its (last) boundary


class Uploader:
    """The outbox, the delta in flight, the one that may have landed, and the thread sending."""

    def __init__(
        self,
        config: Any,
        transport: Any,
        logger: Any,
        status: NodeStatus,
        spill_dir: str | Path | None = None,
    ):
        self.config, self.transport, self.logger, self.status = config, transport, logger, status
        self.node_id: str = config.node_id
        # This process's chain of increments: the master adds up one chain's deltas (a
        # checkpoint keeps it, so --resume continues the chain; a fresh start is a new one)
        self.chain = secrets.token_hex(8)
        self.seq = 0  # the last sequence number given
        self.outbox: Pending | None = None
        self.sending: Pending | None = None  # the delta the uploader holds right now
        self.exact: Pending | None = None  # may have landed: only these bytes may go again
        budget = getattr(config, "in_flight_disk_bytes", 8 << 30)
        # sent, not yet in a published global: exact records, memory then disk (I2)
        self.in_flight = InFlight(spill_dir, budget, logger.warn)
        self.upload_seconds: list[float] = []  # how long each upload took, for the poll advice
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.held = False  # the in-flight budget is full: the outbox waits for a global
        self.final_seq: int | None = None  # the seq of the run's last delta, once it is sent
        self.resumed_seq: int | None = None  # the checkpoint's seq, on --resume
        self.resumed_step: int | None = None  # the trainer's step at the start (worker plugin)
        self.replayed_to = 0  # a resumed node's steps its previous process already sent
        self.unsettled: int | None = None  # resumed, and that is not known yet: nothing goes out
        self.hello = Announcement(self)  # that this node's run has begun (worker/resume.py)
        enabled = getattr(config, "error_feedback", True)
        say = getattr(logger, "notice", logger.warn)
        self.feedback = ErrorFeedback(config.delta_dtype, enabled, say)

    def number_past_used(self, max_bytes: int = 1 << 40) -> None:
        """New names start past every one this node used (``worker/resume.py``); after a resume,
        what the process it resumes sent after the checkpoint is not sent again (I1)."""
        number_past_used(self, max_bytes)
        self.in_flight.tidy()

    def queue(self, pending: Pending) -> None:
        with self.lock:
            self.outbox = pending if self.outbox is None else fold(self.outbox, pending)
        self.wake.set()

    def all_sent(self) -> bool:
        with self.lock:
            idle = self.outbox is None and self.sending is None and self.exact is None
            return idle and self.hello.data is None

    def unsent(self) -> bool:
        with self.lock:
            waiting = self.outbox is not None or self.exact is not None
            return waiting or self.hello.data is not None

    def _room(self, pending: Pending, size: int) -> bool:
        """Whether the in-flight records can keep one more; if not, ``pending`` goes back to
        the outbox, unnamed (later inner loops are added to it) until a global frees some."""
        with self.lock:
            if self.in_flight.room(size):
                self.held = False
                return True
            if not self.held:
                self.logger.warn(
                    f"diloco: {len(self.in_flight)} deltas of this node are out and no global "
                    f"includes them ({self.in_flight.spilled_bytes >> 20} MB on disk, the "
                    "in_flight_disk_bytes budget): later inner loops wait in the outbox, added "
                    "up, until the master catches up"
                )
            self.held, self.sending = True, None  # its name stays its own: nothing was sent
            self.outbox = pending if self.outbox is None else fold(pending, self.outbox)
            return False

    def run(self) -> None:
        """The uploader thread: send on each wake-up; after a failure back off and retry."""
        wait, stop = RETRY_S[0], self.status.stop
        while not stop.is_set():
            self.wake.wait()
            self.wake.clear()
            if self.send_pending():
                wait = RETRY_S[0]
            if self.unsent() and not stop.is_set():
                if self.held:  # no room: a global freeing some wakes it (``included``)
                    self.wake.wait(RETRY_S[1])
                else:
                    stop.wait(wait)  # a failure: back off, then try again with what piled up
                    wait = min(wait * 2, RETRY_S[1])
                self.wake.set()

    def send_pending(self) -> bool:
        """Upload whatever is queued; True if nothing is left to send afterwards."""
        while self._take_and_send():
            pass
        return not self.unsent()

    def drain(self, timeout: float, waiting: Any = None, left: Any = None) -> bool:
        """Wait up to ``timeout`` for queued deltas to go out; whether all did (what stays is
        kept in the checkpoint). ``waiting()`` is called meanwhile (about once a second);
        ``left()``: the seconds a stop still allows (``stopping.EndClock``)."""
        deadline, looked = time.monotonic() + timeout, 0.0
        self.wake.set()
        while time.monotonic() < deadline and self.status.fatal is None:
            if left is not None and left() <= 0:
                break
            if self.all_sent():
                return True
            if waiting is not None and time.monotonic() - looked >= 1.0:
                looked = time.monotonic()
                waiting()
            time.sleep(0.05)
        return self.all_sent()

    def end_run(self, zeros: Any, base: int, end_step: int) -> None:
        """Mark the run's last delta: the one waiting in the outbox, or, when everything went
        out already and the last was not marked, an end marker (0 steps, the tensors ``zeros()``
        makes)."""
        with self.lock:
            if self.outbox is not None:
                self.outbox = replace(self.outbox, final=True)
            elif not any(p is not None and p.final for p in (self.exact, self.sending)):
                if self.final_seq is None or self.final_seq < self.seq:
                    self.outbox = Pending(zeros(), base, 0, 0, final=True, end_step=end_step)
        self.wake.set()

    def _take_and_send(self) -> bool:
        """Send the outbox; True on success. A failed delta goes back, folded with later ones.

        Transports raise only when the file did not land, so folding cannot count it twice.
        """
        self.hello.send()
        if not settled(self):  # a resumed node that cannot yet tell what it sent before (I1)
            return False
        pending, was_exact = self._take()
        if pending is None:
            return False
        seq, header = pending.seq, header_for(self, pending)
        sent, previous = pending, self.feedback.residual
        try:
            data, sent = self._encode(pending, header, was_exact)
            if data is None:
                return False
            start = time.monotonic()
            self.transport.upload(delta_path(self.node_id, seq), data)
            self.upload_seconds.append(time.monotonic() - start)
        except Exception as exc:  # anything: the uploader thread must outlive it (I5)
            self._failed(pending, was_exact, exc, sent, previous)
            return False
        with self.lock:
            self.sending = None
            self.in_flight.add(seq, data, header.encoding)
            self.final_seq = seq if pending.final else self.final_seq
        counters = self.status.counters
        counters["uploads"] += 1
        counters["bytes_up"] += len(data)
        self.logger.log("diloco_upload", {"seq": seq, "bytes": len(data), "steps": header.steps})
        return True

    def _encode(self, pending: Pending, header: DeltaHeader, was_exact: bool) -> tuple:
        """``(bytes, the Pending they encode)``, or ``(None, pending)`` when no room is left.

        A delta that may have landed is re-encoded as it is (the same bytes: the encodings are
        deterministic); a new one gets the residual added (``worker/feedback``), and from here
        on it is what is being sent, and the residual is what its bytes dropped. An end marker
        carries no work, so never the residual: that is the run's last, never sent (the master
        rejects a marker that is not zeros, and after a resume the residual may be one the
        previous process sent already).
        """
        if was_exact or pending.steps == 0:
            return encode_delta(pending.delta, header), pending
        generation = self.feedback.generation
        data, target, residual = self.feedback.encode(pending.delta, header)
        if not self._room(pending, len(data)):
            return None, pending
        with self.lock:
            self.sending = replace(pending, delta=target)
            if self.feedback.enabled and generation == self.feedback.generation:
                self.feedback.residual = residual
        return data, self.sending

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

    def _failed(
        self, pending: Pending, was_exact: bool, exc: Exception, sent: Pending, previous: Any
    ) -> None:
        """``sent``: the delta as encoded, residual added; ``previous``: the residual before."""
        self.status.counters["upload_failures"] += 1
        self.status.stop_if_permanent(exc)
        if self.status.fatal is None:
            self.logger.warn(f"diloco: upload of delta {pending.seq} failed ({exc}); will retry")
        with self.lock:
            self.sending = None
            if was_exact or getattr(exc, "maybe_landed", False):
                self.exact = sent  # resent as is: the master counts it once
            else:  # nothing landed: the name is still free for the sum with later ones
                self.outbox = pending if self.outbox is None else fold(pending, self.outbox)
                if sent is not pending and self.feedback.residual is not None:
                    self.feedback.residual = previous  # what it dropped was not sent either

    def included(self, included_seq: int) -> None:
        """A global includes this node's deltas up to ``included_seq``: their records go (and
        an outbox held back for room goes out)."""
        with self.lock:
            freed = self.in_flight.drop_through(included_seq)
        if freed and self.held:
            self.wake.set()

    def not_included(self, included_seq: int) -> dict[str, torch.Tensor] | None:
        """The sum of every delta of this node that a global including its deltas up to
        ``included_seq`` lacks: sent later, being sent, or not sent yet (CPU, fp32), exactly
        as the master applies them."""
        self.included(included_seq)
        with self.lock:
            parts = self.in_flight.after(included_seq)
            unsent = (self.exact, self.sending, self.outbox)  # may have landed: by their seq
            parts += [p.delta for p in unsent if p is not None and not 0 < p.seq <= included_seq]
            if not parts:
                return None
            return {
                k: sum(part[k].detach().to("cpu", torch.float32) for part in parts)
                for k in parts[0]
            }

    # ------------------------------------------------------------------ checkpoint state

    def state_dict(self) -> dict[str, Any]:
        return uploader_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_uploader_state(self, state)


def header_for(up: Uploader, pending: Pending) -> DeltaHeader:
    return DeltaHeader(
        node_id=up.node_id,
        seq=pending.seq,
        base_outer_step=max(pending.base_outer_step, 0),
        steps=pending.steps,
        tokens=pending.tokens,
        encoding=up.config.delta_dtype,
        created_at=pending.created_at,
        chain=up.chain,
        final=pending.final,
        end_step=pending.end_step,
    )


def uploader_state(up: Uploader) -> dict[str, Any]:
    """An ``Uploader``'s checkpoint state: its chain, numbering, records, outbox, residual."""
    with up.lock:
        # A delta being sent now may land after this state is saved: it is kept as "exact",
        # to be sent again unchanged after a resume, which the master then counts once.
        unsent, exact = up.outbox, up.exact or up.sending
        return {
            "chain": up.chain,
            "in_flight": up.in_flight.state(),
            "seq": up.seq,
            "final_seq": up.final_seq,
            "unsent": None if unsent is None else pending_state(unsent),
            "exact": None if exact is None else pending_state(exact),
            "residual": up.feedback.state(),
        }


def load_uploader_state(up: Uploader, state: dict[str, Any]) -> None:
    up.chain = state.get("chain", up.chain)  # older checkpoints: a new chain
    up.in_flight.load(state.get("in_flight", []))
    up.seq = up.resumed_seq = int(state["seq"])
    up.final_seq = state.get("final_seq")
    unsent, exact = state.get("unsent"), state.get("exact")
    up.outbox = None if unsent is None else Pending(**unsent)
    up.exact = None if exact is None else Pending(**exact)
    up.feedback.load(state.get("residual"))  # older checkpoints: no residual


def fold(first: Pending, later: Pending) -> Pending:
    """One delta for two consecutive inner loops: sums, with the older base (more stale)."""
    delta = {k: first.delta[k] + later.delta[k] for k in first.delta}
    return replace(
        first,
        delta=delta,
        base_outer_step=min(first.base_outer_step, later.base_outer_step),
        steps=first.steps + later.steps,
        tokens=first.tokens + later.tokens,
        final=later.final,
        end_step=max(first.end_step, later.end_step),
    )


def pending_state(pending: Pending) -> dict[str, Any]:
    return {
        "delta": {k: v.cpu() for k, v in pending.delta.items()},
        "base_outer_step": pending.base_outer_step,
        "steps": pending.steps,
        "tokens": pending.tokens,
        "seq": pending.seq,
        "created_at": pending.created_at,
        "final": pending.final,
        "end_step": pending.end_step,
    }

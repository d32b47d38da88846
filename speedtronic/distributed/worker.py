"""The node side of DumbDiLoCo: a Trainer plug-in that trains locally and syncs at boundaries.

Every ``inner_steps`` optimizer steps (a boundary) the plug-in snapshots the weights, computes
the pseudo-gradient against the weights of the last sync (``base - current``) and hands it to
a background uploader; then, only there (I2), it installs the newest global weights a
background poller has downloaded and validated, resetting the inner optimizer if configured.
The training thread never touches the network (I5): a failed or hung upload keeps its delta in
the outbox, where the next boundary's delta is added to it (cumulative, never lost); the poller
just keeps the last good global. The plug-in's state (base weights, the outbox, counters) goes
into the run's checkpoints, so ``--resume`` continues exactly.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import torch
from torch import nn

from speedtronic.distributed.codec import (
    BadDelta,
    decode_weights,
    encode_delta,
    expected_delta_bytes,
)
from speedtronic.distributed.protocol import (
    GLOBAL_WEIGHTS,
    DeltaHeader,
    delta_path,
    parse_delta_path,
)
from speedtronic.distributed.transport import Transport
from speedtronic.errors import SpeedtronicError

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


def parameters_of(model: nn.Module) -> dict[str, nn.Parameter]:
    """Trainable parameters by name; tied weights appear once (named_parameters dedupes)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def snapshot(params: dict[str, nn.Parameter], device: str | None = None) -> dict[str, torch.Tensor]:
    """An fp32 copy of the weights, where they live unless ``device`` says otherwise.

    The node keeps its base weights on the training device: a copy there and a subtraction
    are the whole boundary cost of the training thread (microseconds on a GPU); the uploader
    thread moves the delta to the CPU. It costs one extra fp32 copy of the weights there.
    """
    return {
        k: p.detach().to(device or p.device, torch.float32, copy=True) for k, p in params.items()
    }


@dataclass(frozen=True)
class Ready:
    """A downloaded, validated global: its outer step and weights, the fleet's tokens in its
    round (for ``reapply_own_delta``) and this node's latest sequence number it includes."""

    outer_step: int
    weights: dict[str, torch.Tensor]
    fleet_tokens: int
    own_seq: int = -1


class WorkerPlugin:
    """Trainer plug-in: boundaries, background upload with folding, global installs."""

    name = "diloco"

    def __init__(
        self,
        config: Any,
        model: nn.Module,
        transport: Transport,
        logger: Any,
        background: bool = True,
    ):
        """``background=False`` starts no threads: the caller drives ``send_pending`` and
        ``refresh`` itself (simulations with a virtual clock, e.g. the convergence benchmark)."""
        self.config, self.transport, self.logger = config, transport, logger
        self.background = background
        self.params = parameters_of(model)
        self.node_id: str = config.node_id
        self.base: dict[str, torch.Tensor] | None = None
        self.base_outer_step = -1  # the outer step of the global the base came from
        self.boundary_step = self.boundary_tokens = 0
        self.seq = 0
        self.outbox: Pending | None = None
        self.sending: Pending | None = None  # the delta the uploader holds right now
        self.exact: Pending | None = None  # may have landed: only these bytes may go again
        self._fetching = threading.Lock()  # one refresh at a time (poller, boundary wait)
        self.ready: Ready | None = None  # a validated global newer than the base, to install
        self.counters = {"uploads": 0, "upload_failures": 0, "bytes_up": 0, "bytes_down": 0}
        self.fatal: Exception | None = None  # a permanent transport failure, raised in training
        self._started: float | None = None  # when training started, to time the first loop
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ trainer hooks

    def on_train_start(self, trainer: Any) -> None:
        self._started = time.perf_counter()
        if self.base is None:  # not restored from a checkpoint: start from the newest global
            self._install_latest_global_now()
            self.boundary_step, self.boundary_tokens = trainer.step, trainer.tokens
        # New names start past every one this node used, also after the checkpoint: a reused
        # name could be deleted unread by a master consuming the old file there (I1)
        self.seq = max([self.seq, *self._own_sequence_numbers()])
        if not self.background:
            return
        for target in (self._upload_loop, self._poll_loop):
            thread = threading.Thread(target=target, name=f"diloco-{target.__name__}", daemon=True)
            thread.start()
            self._threads.append(thread)
        if self._unsent():
            self._wake.set()

    def after_optimizer_step(self, trainer: Any) -> None:
        if self.fatal is not None:
            raise self.fatal
        if trainer.step - self.boundary_step >= self.config.inner_steps:
            self.boundary(trainer)

    def on_train_end(self, trainer: Any, result: Any) -> None:
        """A last boundary for the steps since the previous one, then its upload (bounded)."""
        if self.fatal is not None:
            raise self.fatal
        if self._stop.is_set():
            return  # already finished, e.g. by the master plug-in of the same node
        if trainer.step > self.boundary_step:
            self.boundary(trainer)
        if self.background:
            self._drain(timeout=self.config.upload_timeout_s)
        else:
            self.send_pending()
        self._stop.set()
        self._wake.set()
        if self.fatal is not None:
            raise self.fatal

    # ------------------------------------------------------------------ the boundary

    def boundary(self, trainer: Any) -> None:
        """Capture this inner loop's delta, queue it, and install a newer global if there is one."""
        start = time.perf_counter()
        current = snapshot(self.params)
        delta = {k: self.base[k] - current[k] for k in current}  # base - current, fp32
        steps = trainer.step - self.boundary_step
        tokens = trainer.tokens - self.boundary_tokens
        self._queue(Pending(delta, self.base_outer_step, steps, tokens))
        self.boundary_step, self.boundary_tokens = trainer.step, trainer.tokens
        self.base = current
        own: tuple[dict, int] | None = (delta, tokens)
        if self.config.sync_wait_s > 0 and self.background and self._wait_for_own_round():
            own = None  # the global holds this delta already
        installed = self.install_ready(trainer, own=own)
        if self._started is not None:  # the first loop gives the step time: check the budgets
            step_time_s, self._started = (start - self._started) / max(steps, 1), None
            for message in self.transport.cadence_warnings(self.config, step_time_s):
                self.logger.warn(f"diloco: {message}")
        stall = time.perf_counter() - start
        payload = {"step": trainer.step, "stall_s": stall, "installed": installed}
        payload["outer_step"] = self.base_outer_step
        self.logger.log("diloco_boundary", {**payload, **self.counters, **self.transport.stats()})

    def _queue(self, pending: Pending) -> None:
        with self._lock:
            self.outbox = pending if self.outbox is None else fold(self.outbox, pending)
        self._wake.set()

    def _wait_for_own_round(self) -> bool:
        """``sync_wait_s``: wait, up to that long, for a global holding this node's newest delta.

        True once the uploader has sent everything and a fetched global's ``step_count`` names
        this node's last sequence number (the master lists each node's latest included delta).
        Polls at most once a second (Hub calls are budgeted); past the deadline the boundary
        goes on asynchronously, as with ``sync_wait_s: 0``.
        """
        deadline = time.monotonic() + self.config.sync_wait_s
        pace = min(self.config.poll_interval, 1.0)
        self._wake.set()  # the uploader sends now
        while time.monotonic() < deadline and self.fatal is None:
            with self._lock:
                sent = self.outbox is None and self.sending is None and self.exact is None
                ready = self.ready
            if sent and ready is not None and ready.own_seq >= self.seq:
                return True
            if sent:
                self.refresh()
            time.sleep(pace if sent else 0.01)
        return False

    def install_ready(self, trainer: Any, own: tuple[dict, int] | None = None) -> int | None:
        """Install a downloaded global newer than the base; its outer step, or None.

        ``own`` is the delta this boundary just queued and its tokens. The global cannot contain
        it yet, so with ``reapply_own_delta`` the node steps from the global by the share the
        master will give it (``outer_lr`` x its tokens / the fleet's), instead of training its
        next inner loop from weights that lack its own last one.
        """
        with self._lock:
            ready, self.ready = self.ready, None
        if ready is None or ready.outer_step <= self.base_outer_step:
            return None
        outer_step, weights, fleet_tokens = ready.outer_step, ready.weights, ready.fleet_tokens
        self._load_weights(weights)
        if own is not None and fleet_tokens and self.config.reapply_own_delta:
            share = self.config.outer_lr * min(1.0, own[1] / fleet_tokens)
            with torch.no_grad():
                for name, param in self.params.items():
                    param.sub_(own[0][name].to(param.dtype), alpha=share)
        self.base, self.base_outer_step = snapshot(self.params), outer_step
        if self.config.reset_inner_optimizer:
            trainer.optimizer.state.clear()  # AdamW moments were of the old trajectory
        return outer_step

    def _load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, param in self.params.items():
                param.copy_(weights[name].to(param.device, param.dtype))

    # ------------------------------------------------------------------ background threads

    def _upload_loop(self) -> None:
        wait = RETRY_S[0]
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if self.send_pending():
                wait = RETRY_S[0]
            if self._unsent() and not self._stop.is_set():
                self._stop.wait(wait)  # a failure: back off, then try again with what piled up
                wait = min(wait * 2, RETRY_S[1])
                self._wake.set()

    def send_pending(self) -> bool:
        """Upload whatever is queued; True if nothing is left to send afterwards."""
        while self._take_and_send():
            pass
        return not self._unsent()

    def _unsent(self) -> bool:
        with self._lock:
            return self.outbox is not None or self.exact is not None

    def _take_and_send(self) -> bool:
        """Send the outbox; True on success. A failed delta goes back, folded with later ones.

        Transports raise only when the file did not land, so folding cannot count it twice.
        """
        with self._lock:
            was_exact = self.exact is not None
            if was_exact:  # first: it may have landed, so it goes again unchanged
                pending, self.exact = self.exact, None
            elif self.outbox is not None:
                pending, self.outbox = self.outbox, None
            else:
                return False
            if not pending.seq:  # its name and time, fixed from its first attempt on
                self.seq += 1
                stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
                pending = replace(pending, seq=self.seq, created_at=stamp)
            self.sending = pending
        seq, header = pending.seq, self._header(pending)
        try:
            data = encode_delta(pending.delta, header)
            self.transport.upload(delta_path(self.node_id, seq), data)
        except Exception as exc:  # anything: the uploader thread must outlive it (I5)
            self.counters["upload_failures"] += 1
            self._stop_if_permanent(exc)
            if self.fatal is None:
                self.logger.warn(f"diloco: upload of delta {seq} failed ({exc}); will retry")
            with self._lock:
                self.sending = None
                if was_exact or getattr(exc, "maybe_landed", False):
                    self.exact = pending  # resent as is: the master counts it once
                else:  # nothing landed: the name is still free for the sum with later ones
                    self.outbox = pending if self.outbox is None else fold(pending, self.outbox)
            return False
        with self._lock:
            self.sending = None
        self.counters["uploads"] += 1
        self.counters["bytes_up"] += len(data)
        self.logger.log("diloco_upload", {"seq": seq, "bytes": len(data), "steps": header.steps})
        return True

    def _header(self, pending: Pending) -> DeltaHeader:
        return DeltaHeader(
            node_id=self.node_id,
            seq=pending.seq,
            base_outer_step=max(pending.base_outer_step, 0),
            steps=pending.steps,
            tokens=pending.tokens,
            encoding=self.config.delta_dtype,
            created_at=pending.created_at,
        )

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.config.poll_interval)

    def refresh(self) -> None:
        """Download and validate a newer global, to be installed at the next boundary."""
        try:
            with self._fetching:
                self._fetch_newer_global()
        except Exception as exc:  # anything: the poller thread must outlive it (I5)
            self._stop_if_permanent(exc)
            self.logger.warn(f"diloco: could not fetch the global weights ({exc})")

    def _stop_if_permanent(self, exc: Exception) -> None:
        """A permanent failure (no access, no repo) ends the run at the next step, exit 1."""
        if getattr(exc, "permanent", False) and self.fatal is None:
            self.fatal = exc
            self._stop.set()

    def _fetch_newer_global(self) -> None:
        counted = self.transport.read_step_count()
        known = max(self.base_outer_step, self.ready.outer_step if self.ready else -1)
        if counted is None or counted["outer_step"] <= known:
            return
        data = self.transport.read(GLOBAL_WEIGHTS, self._max_weight_bytes())
        if data is None:
            return
        outer_step, weights = decode_weights(data, self.base)
        self.counters["bytes_down"] += len(data)
        if outer_step != counted["outer_step"]:
            return  # a publish in flight: step_count and weights disagree until it ends
        own_seq = ((counted.get("nodes") or {}).get(self.node_id) or {}).get("seq")
        own_seq = own_seq if type(own_seq) is int else -1
        with self._lock:  # never replace a newer global already waiting
            if outer_step > (self.ready.outer_step if self.ready else self.base_outer_step):
                self.ready = Ready(outer_step, weights, counted.get("fleet_tokens") or 0, own_seq)

    def _install_latest_global_now(self) -> None:
        """At start only: begin from the newest global, if the run has one."""
        self.base = snapshot(self.params)
        try:
            self._fetch_newer_global()
        except (SpeedtronicError, OSError, ValueError, BadDelta) as exc:
            if getattr(exc, "permanent", False):
                raise
            self.logger.warn(f"diloco: no global weights at start ({exc}); using local ones")
        with self._lock:
            ready, self.ready = self.ready, None
        if ready is not None:
            self._load_weights(ready.weights)
            self.base, self.base_outer_step = snapshot(self.params), ready.outer_step
            self.logger.notice(f"diloco: starting from global outer step {ready.outer_step}")

    def _own_sequence_numbers(self) -> list[int]:
        """Numbers this node used: its deltas in the repo and its latest the master accepted."""
        try:
            refs = self.transport.list_deltas()
            counted = self.transport.read_step_count() or {}
        except (SpeedtronicError, OSError) as exc:
            if getattr(exc, "permanent", False):
                raise
            self.logger.warn(f"diloco: cannot list the repo ({exc}); numbering from {self.seq}")
            return []
        accepted = ((counted.get("nodes") or {}).get(self.node_id) or {}).get("seq")
        listed = [
            parsed[1]
            for r in refs
            if r.problem is None
            and (parsed := parse_delta_path(r.path))
            and parsed[0] == self.node_id
        ]
        return listed + ([accepted] if type(accepted) is int else [])

    def _max_weight_bytes(self) -> int:
        return expected_delta_bytes(self.base, "fp32") + (1 << 20)

    def _drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` for queued deltas to go out; what stays is kept in the state."""
        deadline = time.monotonic() + timeout
        self._wake.set()
        while time.monotonic() < deadline and self.fatal is None:
            with self._lock:
                if self.outbox is None and self.sending is None and self.exact is None:
                    return
            time.sleep(0.05)
        self.logger.warn("diloco: deltas still unsent at the end; they are in the checkpoint")

    # ------------------------------------------------------------------ checkpoint state

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            # A delta being sent now may land after this state is saved: it is kept as "exact",
            # to be sent again unchanged after a resume, which the master then counts once.
            unsent, exact = self.outbox, self.exact or self.sending
            return {
                "base": {k: v.cpu() for k, v in (self.base or {}).items()},
                "base_outer_step": self.base_outer_step,
                "boundary": [self.boundary_step, self.boundary_tokens],
                "seq": self.seq,
                "unsent": None if unsent is None else pending_state(unsent),
                "exact": None if exact is None else pending_state(exact),
                "counters": dict(self.counters),
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        base = state["base"]  # onto the training device, as snapshot() keeps it
        self.base = {k: base[k].to(p.device) for k, p in self.params.items()} if base else None
        self.base_outer_step = int(state["base_outer_step"])
        self.boundary_step, self.boundary_tokens = (int(v) for v in state["boundary"])
        self.seq = int(state["seq"])
        unsent, exact = state.get("unsent"), state.get("exact")
        self.outbox = None if unsent is None else Pending(**unsent)
        self.exact = None if exact is None else Pending(**exact)
        self.counters.update(state.get("counters", {}))


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

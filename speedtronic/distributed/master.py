"""The master's loop: poll the repo for deltas, run rounds of ``outer.Master``, publish globals.

``MasterLoop`` drives the pure policy object with I/O: every ``poll_interval`` its
``DeltaIntake`` offers the deltas it has not seen (validated, I4), and when a round is ready
its ``Publisher`` saves the master state to ``state_dir`` *before* publishing the new weights
and ``step_count.json`` and deleting the consumed deltas (I3). At start it resumes the newest
of its state, a checkpoint's copy and the repo. It runs in a background thread during training
(``MasterPlugin``) or alone (``serve``, for a master with ``train_locally: false``).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from speedtronic.distributed.codec import decode_weights
from speedtronic.distributed.master_intake import DeltaIntake
from speedtronic.distributed.master_publish import Publisher
from speedtronic.distributed.outer import Master, MasterConfig, MasterState, RoundResult
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, NODE_ID_RE
from speedtronic.distributed.transport import Transport
from speedtronic.errors import SpeedtronicError, TransportError

Tensors = dict[str, torch.Tensor]


def master_config(config: Any) -> MasterConfig:
    """The policy settings of a ``distributed`` config section."""
    return MasterConfig(
        outer_lr=config.outer_lr,
        outer_momentum=config.outer_momentum,
        min_deltas=config.min_deltas,
        max_wait_s=config.max_wait_s,
        max_staleness=config.max_staleness,
        staleness_discount=config.staleness_discount,
        policy=config.outer_policy,
    )


def known_nodes(counted: dict | None) -> dict[str, dict[str, Any]]:
    """The ``nodes`` summary of a published step count, kept only where well-formed."""
    nodes = (counted or {}).get("nodes")
    if not isinstance(nodes, dict):
        return {}
    fields = ("seq", "base_outer_step", "last_delta_at", "tokens")
    return {
        node: {k: info[k] for k in fields}
        for node, info in nodes.items()
        if isinstance(node, str) and NODE_ID_RE.fullmatch(node)
        if isinstance(info, dict) and all(k in info for k in fields)
    }


class MasterLoop:
    """Polls, aggregates and publishes; one thread calls ``poll_once`` at a time.

    The intake (``master_intake``) fetches and validates deltas, the pure ``outer.Master``
    runs rounds, the publisher (``master_publish``) saves and publishes them.
    """

    def __init__(
        self,
        config: Any,
        weights: Tensors,
        transport: Transport,
        logger: Any,
        state_dir: str | Path,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``clock`` times the quorum's ``max_wait_s`` (simulations pass a virtual one)."""
        self.config, self.transport, self.logger = config, transport, logger
        self.clock = clock
        self.state_dir = Path(state_dir)
        self.initial_weights = weights
        self.master: Master | None = None
        now = lambda: self.clock()  # noqa: E731 - a simulation may swap the clock later
        self.intake = DeltaIntake(transport, logger, weights, now)
        self.publisher = Publisher(transport, logger, self.state_dir, now)
        self.lock = threading.Lock()  # rounds vs. checkpoint snapshots from the training thread
        self.fatal: Exception | None = None  # a permanent transport failure, raised in training

    @property
    def counters(self) -> dict[str, int]:
        return self.intake.counters

    @property
    def unpublished(self) -> bool:
        """A saved outer step the repo does not have yet (its publish failed)."""
        return self.publisher.unpublished

    # ------------------------------------------------------------------ start-up

    def start(self, restored: MasterState | None = None) -> None:
        """Resume the newest of: state_dir, the trainer checkpoint's copy, the repo; publish it."""
        state = MasterState.load(self.state_dir, log=self.logger.warn)
        if restored is not None and (state is None or restored.outer_step > state.outer_step):
            state = restored
        counted = self.transport.read_step_count()
        self.intake.nodes = known_nodes(counted)
        published = self._published_state(counted, state.outer_step if state else -1)
        state = published or state
        policy = master_config(self.config)
        for message in policy.warnings():  # e.g. naive async: said once, in the run's log
            self.logger.warn(f"diloco master: {message}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            self.master = Master(policy, self.initial_weights, state)
        if counted is None or counted["outer_step"] < self.master.outer_step:
            self._publish(self.master.global_weights)
        self.logger.notice(f"diloco master: outer step {self.master.outer_step}")

    def _published_state(self, counted: dict | None, local_step: int) -> MasterState | None:
        """The repo's global, if it is ahead of everything local (a master on a new machine)."""
        if counted is None or counted["outer_step"] <= local_step:
            return None
        data = self.transport.read(GLOBAL_WEIGHTS, self.intake.max_bytes)
        outer_step, weights = decode_weights(data or b"", self.initial_weights)
        self.logger.warn(
            f"diloco master: the repo is at outer step {outer_step}, ahead of {self.state_dir}; "
            "continuing from the published weights (outer momentum starts again from zero)"
        )
        return MasterState(outer_step, weights)

    # ------------------------------------------------------------------ one poll

    def poll_once(self, force: bool = False) -> RoundResult | None:
        """Fetch new deltas, offer them, and run (and publish) a round if one is ready."""
        self.intake.poll(self.master)
        if not force and not self.publisher.due():
            return None  # the offered deltas wait for the next poll's round
        with self.lock:
            result = self.master.round(self.clock(), force=force)
        if result is None:
            if self.publisher.unpublished:  # the last publish failed: the repo is behind
                with self.lock:
                    weights = {k: t.clone() for k, t in self.master.global_weights.items()}
                self._publish(weights)
            return None
        self._count_round(result)
        self.intake.consumed(result.consumed)
        self._publish(result.weights)
        return result

    def _publish(self, weights: Tensors) -> None:
        """Publish, deleting every settled file; if it fails, the next poll tries again."""
        consumed = list(self.intake.unusable)
        extra = {"nodes": self.intake.nodes}
        self.publisher.publish(self.master, weights, consumed, extra)
        self.intake.deleted(consumed)

    def _count_round(self, result: RoundResult) -> None:
        counters = self.intake.counters
        counters["included"] += len(result.included)
        counters["stale"] += len(result.stale)
        self.logger.log(
            "diloco_round",
            {
                "outer_step": result.outer_step,
                **result.counts,  # this round's; the counters below are totals so far
                "tokens": result.tokens,
                "momentum": result.momentum_applied,
                **{f"total_{k}": v for k, v in counters.items()},
                **self.transport.stats(),
            },
        )

    # ------------------------------------------------------------------ running

    def run_in_background(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self._loop, args=(stop,), name="diloco-master")
        thread.daemon = True
        thread.start()
        return thread

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set() and self.fatal is None:
            self.poll_safely()
            stop.wait(self.config.poll_interval)

    def poll_safely(self, force: bool = False) -> RoundResult | None:
        """``poll_once``, with failures logged rather than raised (I5: training goes on)."""
        try:
            return self.poll_once(force)
        except (SpeedtronicError, OSError) as exc:
            if getattr(exc, "permanent", False):  # no access, no repo: retrying cannot help
                self.fatal = self.fatal or exc
                return None
            self.logger.warn(f"diloco master: poll failed ({exc}); retrying next interval")
            return None
        finally:
            for message in getattr(self.transport, "take_warnings", list)():
                self.logger.warn(f"diloco master: {message}")

    def serve(self, outer_steps: int, stop: threading.Event) -> None:
        """Coordinate only (no local training) until ``outer_steps`` rounds or ``stop``."""
        while not stop.is_set() and self.master.outer_step < outer_steps:
            self.poll_safely()
            if self.fatal is not None:
                raise self.fatal
            stop.wait(self.config.poll_interval)


class MasterPlugin:
    """Trainer plug-in running ``MasterLoop`` beside local training; a final round at the end."""

    name = "diloco_master"

    def __init__(self, loop: MasterLoop, local_worker: Any = None):
        """``local_worker``: this node's own WorkerPlugin, finished before the final round."""
        self.loop, self.local_worker = loop, local_worker
        self.restored: MasterState | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def on_train_start(self, trainer: Any) -> None:
        self.loop.start(self.restored)
        self._thread = self.loop.run_in_background(self._stop)

    def after_optimizer_step(self, trainer: Any) -> None:
        if self.loop.fatal is not None:
            raise self.loop.fatal

    def on_train_end(self, trainer: Any, result: Any) -> None:
        if self.local_worker is not None:  # its last delta belongs in the final round
            self.local_worker.on_train_end(trainer, result)
        self._stop.set()
        self._thread.join(timeout=max(self.loop.config.poll_interval, 30.0))
        if self._thread.is_alive():
            self.loop.logger.warn("diloco master: the poll thread is stuck; no final round")
            return
        self.loop.poll_safely(force=True)  # what arrived while training ended
        if self.loop.fatal is not None:
            raise self.loop.fatal
        if self.loop.unpublished:  # saved in state_dir, not in the repo: never exit 0 on that
            raise TransportError(
                f"diloco master: outer step {self.loop.master.outer_step} is saved in "
                f"{self.loop.state_dir} but could not be published",
                hint="start the master again (--resume): it publishes it first",
            )

    def state_dict(self) -> dict[str, Any]:
        """A copy of the master state, for a node whose state_dir is lost; never the newest."""
        if self.loop.master is None:
            return {}
        with self.loop.lock:
            state = self.loop.master.snapshot()
            weights = {k: t.clone() for k, t in state.global_weights.items()}
        return {
            "outer_step": state.outer_step,
            "weights": weights,
            "optimizer": state.optimizer_state,
            "processed": sorted(state.processed),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.restored = MasterState(
                state["outer_step"], state["weights"], state["optimizer"], set(state["processed"])
            )

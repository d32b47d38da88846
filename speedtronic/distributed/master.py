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

from speedtronic.distributed.master_intake import DeltaIntake
from speedtronic.distributed.master_publish import Publisher, PublishSender
from speedtronic.distributed.master_repo import RepoGuard
from speedtronic.distributed.master_state import master_id, newest_saved_step
from speedtronic.distributed.node_status import Throttle
from speedtronic.distributed.outer import Master, MasterConfig, MasterState, RoundResult
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
        self.master_id = master_id(self.state_dir)
        # The repo is looked at every 10 polls, at most a minute apart (a Hub call each time)
        every = max(config.poll_interval, min(60.0, 10 * config.poll_interval))
        self.guard = RepoGuard(transport, logger, self.master_id, weights, now, every)
        self._restored: MasterState | None = None
        self.throttle = Throttle()  # a failure repeating at every poll: one line a minute
        self.sender: PublishSender | None = None  # publishes off the poll thread when running
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
        """Resume this master's state (state_dir, or the trainer checkpoint's copy if newer)
        and hold the repo to it (I3: the state, not the repo, is the source of truth); with no
        state of its own, continue from the repo. A repo it cannot read now is read again at
        the next poll: with no state, nothing is published before then."""
        for message in master_config(self.config).warnings():  # e.g. naive async: said once
            self.logger.warn(f"diloco master: {message}")
        self._restored = restored
        self._start_now()

    def _start_now(self) -> None:
        state = MasterState.load(self.state_dir, log=self.logger.warn)
        restored = self._restored
        if restored is not None and (state is None or restored.outer_step > state.outer_step):
            state = restored
        try:
            view = self.guard.inspect(with_weights=True, max_bytes=self.intake.max_bytes)
        except Exception as exc:  # the repo is unreachable now: judged at the next poll
            if getattr(exc, "permanent", False):
                raise
            self._say_unchecked(exc, state)
            if state is not None:
                self._resume(state)
            return
        state, publish = self.guard.at_start(state, view, newest_saved_step(self.state_dir))
        # the state's own summary when it has one (older states: the repo's)
        self.intake.nodes = dict((state.nodes if state else None) or view.nodes or {})
        self._resume(state)
        self.guard.last_check = self.clock()
        rate = (view.count or {}).get("fleet_tokens_per_step")  # the pace its state says
        publish = publish or bool(state and state.fleet and rate != round(self.master.fleet_rate))
        if not publish and view.step is not None:  # the repo holds this master's step
            self.publisher.last_step, self.publisher.last_sha = view.step, view.sha256
            self.publisher.last_count = view.count  # the whole file, for the periodic look
        if publish:
            self._publish_safely(self.master.global_weights)

    def _resume(self, state: MasterState | None) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # said once, in start()
            self.master = Master(master_config(self.config), self.initial_weights, state)
        self.logger.notice(f"diloco master: outer step {self.master.outer_step}")

    def _say_unchecked(self, exc: Exception, state: MasterState | None) -> None:
        then = "publishing nothing before" if state is None else "its state stands until"
        self.logger.warn(
            f"diloco master: cannot read the repo at start ({exc}); {then} the next poll reads it"
        )

    def _publish_safely(self, weights: Tensors) -> None:
        """Publish at start: a transient failure leaves it to the next poll (I5)."""
        try:
            self._publish(weights)
        except Exception as exc:
            if getattr(exc, "permanent", False):
                raise
            self.logger.warn(f"diloco master: publish failed ({exc}); the next poll retries")

    # ------------------------------------------------------------------ one poll

    def poll_once(self, force: bool = False) -> RoundResult | None:
        """Fetch new deltas, offer them, and run (and publish) a round if one is ready."""
        if not self.guard.checked:  # the repo was unreachable at start: no round before it answers
            self._start_now()
            if not self.guard.checked:
                return None
        if self.sender is not None:
            self.intake.deleted(self.sender.take_landed())
            if self.sender.fatal is not None:
                raise self.sender.fatal
        if self.guard.due():
            self._check_repo()
        self.intake.poll(self.master)
        if not force and not self.publisher.due():
            return None  # the offered deltas wait for the next poll's round
        with self.lock:  # the round and its node summary together, for state_dict's copy
            result = self.master.round(self.clock(), force=force)
            if result is not None:
                self.intake.consumed(result.consumed, result.included)
        if result is None:
            if self.publisher.unpublished and self._sent():  # it failed: the repo is behind
                self._publish(self.master.global_weights)  # copied by the save
            return None
        self._count_round(result)
        self._publish(result.weights)
        return result

    def _check_repo(self) -> None:
        """Look at the repo's global (before every publish, and every few polls): whatever
        happened to it is named in one line, and the next publish restores it."""
        expected, saved = self.publisher.last_count, self.publisher.saved_step
        if expected is not None and self.guard.check(expected, saved, self.intake.max_bytes):
            self.publisher.repo_lost_it = True  # restored by this poll's publish

    def _publish(self, weights: Tensors) -> None:
        """Save, then publish (in the sender's thread when running), deleting every settled
        file; if it fails, it is sent again (the sender) or the next poll publishes again."""
        self._check_repo()  # also refuses to publish over another master's step
        consumed = list(self.intake.unusable)
        extra = {"nodes": dict(self.intake.nodes), "master": self.master_id}
        if self.sender is not None:
            self.sender.submit(self.publisher.save(self.master, weights, consumed, extra))
            return
        self.publisher.publish(self.master, weights, consumed, extra)
        self.intake.deleted(consumed)

    def _sent(self) -> bool:
        return self.sender is None or self.sender.idle()

    def start_sending(self) -> None:
        """Publish from a thread of its own from now on: polls go on during a slow publish."""
        self.sender = PublishSender(self.publisher, self.logger, self.config.poll_interval)

    def stop_sending(self, timeout: float) -> None:
        """Let the sends waiting land (up to ``timeout``); later publishes are synchronous."""
        sender, self.sender = self.sender, None
        if sender is None:
            return
        sender.close(timeout)
        self.intake.deleted(sender.take_landed())
        if sender.fatal is not None:
            self.fatal = self.fatal or sender.fatal

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
                "momentum_state": result.momentum_state,
                **{f"total_{k}": v for k, v in counters.items()},
                **self.transport.stats(),
            },
        )

    # ------------------------------------------------------------------ running

    def run_in_background(self, stop: threading.Event) -> threading.Thread:
        self.start_sending()
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
        except Exception as exc:  # anything a transport raises: the master thread lives on
            if getattr(exc, "permanent", False):  # no access, no repo: retrying cannot help
                self.fatal = self.fatal or exc
                return None
            why = exc if isinstance(exc, (SpeedtronicError, OSError)) else repr(exc)
            line = self.throttle.line(f"diloco master: poll failed ({why}); retrying")
            if line:
                self.logger.warn(line)
            return None
        finally:
            for message in getattr(self.transport, "take_warnings", list)():
                self.logger.warn(f"diloco master: {message}")

    def serve(self, outer_steps: int, stop: threading.Event) -> None:
        """Coordinate only (no local training) until ``outer_steps`` rounds or ``stop``."""
        self.start_sending()
        try:
            while not stop.is_set() and (
                self.master is None or self.master.outer_step < outer_steps
            ):
                self.poll_safely()
                if self.fatal is not None:
                    raise self.fatal
                stop.wait(self.config.poll_interval)
        finally:
            self.stop_sending(timeout=self.config.upload_timeout_s)
        if self.fatal is not None:
            raise self.fatal
        if self.unpublished:  # the sender gave up on it: one more try, in this thread
            self._publish_safely(self.master.global_weights)
        self.raise_if_unpublished()

    def raise_if_unpublished(self) -> None:
        """A step saved in state_dir but not in the repo: never exit 0 on that."""
        if self.unpublished:
            raise TransportError(
                f"diloco master: outer step {self.master.outer_step} is saved in "
                f"{self.state_dir} but could not be published",
                hint="start the master again (--resume): it publishes it first",
            )


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
        self.loop.stop_sending(timeout=self.loop.config.upload_timeout_s)
        self.loop.poll_safely(force=True)  # what arrived while training ended
        if self.loop.fatal is not None:
            raise self.loop.fatal
        if not self.loop.guard.checked:  # no round could run: the deltas were never applied
            raise TransportError(
                f"diloco master: {self.loop.transport.describe()} never answered, so no delta "
                "was aggregated",
                hint="start the master again once the repo is reachable: the deltas wait there",
            )
        self.loop.raise_if_unpublished()

    def state_dict(self) -> dict[str, Any]:
        """A copy of the master state, for a node whose state_dir is lost; never the newest."""
        if self.loop.master is None:
            return {}
        with self.loop.lock:  # the step and the node summary of one round
            state = self.loop.master.snapshot()
            weights = {k: t.clone() for k, t in state.global_weights.items()}
            nodes = dict(self.loop.intake.nodes)
        return {
            "outer_step": state.outer_step,
            "weights": weights,
            "optimizer": state.optimizer_state,
            "processed": sorted(state.processed),
            "nodes": nodes,
            "fleet": state.fleet,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.restored = MasterState(
                state["outer_step"],
                state["weights"],
                state["optimizer"],
                set(state["processed"]),
                state.get("nodes", {}),
                state.get("fleet", {}),
            )

"""The master's loop: poll the repo for deltas, run rounds of ``outer.Master``, publish globals.

``MasterLoop`` drives the pure policy object with I/O: every ``poll_interval`` its
``DeltaIntake`` offers the deltas it has not seen (validated, I4), and when a round is ready
it proposes one, its ``Publisher`` saves the proposed state to ``state_dir``, and only then is
the round committed and published with ``step_count.json``, deleting the consumed deltas (I3). A
round whose save fails never happened; while a saved step has not landed no other round runs,
and staleness is counted from the step that landed (issue 27). At start it resumes the newest of
its state, a checkpoint's copy and the repo. It runs in a background thread during training
(``master/plugin.MasterPlugin``) or alone (``master/plugin.serve``, ``train_locally: false``);
the end of a run (``master/plugin``) waits for every node's last delta and runs the final round,
whose step count says the run has ended (``ended``); a master started again takes that back at
once, as its run goes on.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from speedtronic.distributed.frozen_base import FIELD as BASE_FIELD
from speedtronic.distributed.master.intake import DeltaIntake
from speedtronic.distributed.master.outer import Master, MasterConfig, MasterState, RoundResult
from speedtronic.distributed.master.publish import Publication, Publisher, PublishSender
from speedtronic.distributed.master.repo import RepoGuard
from speedtronic.distributed.master.roster import Roster
from speedtronic.distributed.master.state import master_id, newest_saved_step
from speedtronic.distributed.node_status import Throttle
from speedtronic.distributed.protocol import run_ended
from speedtronic.distributed.transport import Transport
from speedtronic.errors import CheckpointError, ConfigError, SpeedtronicError

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
        shared_rounds=getattr(config, "global_dtype", "fp32") == "deltas",
    )


class MasterLoop:
    """Polls, aggregates and publishes; one thread calls ``poll_once`` at a time.

    The intake (``master/intake``) fetches and validates deltas, the pure ``outer.Master``
    runs rounds, the publisher (``master/publish``) saves and publishes them.
    """

    def __init__(
        self,
        config: Any,
        weights: Tensors,
        transport: Transport,
        logger: Any,
        state_dir: str | Path,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        """``clock`` times the quorum's ``max_wait_s`` (simulations pass a virtual one);
        ``wall`` how long a node has been silent at the end of a run."""
        self.config, self.transport, self.logger = config, transport, logger
        self.clock = clock
        self.state_dir = Path(state_dir)
        self.initial_weights = weights
        self.master: Master | None = None
        now = lambda: self.clock()  # noqa: E731 - a simulation may swap the clock later
        self.roster = Roster(wall, config.poll_interval)
        self.roster.deadline_setting = getattr(config, "drain_timeout_s", None)
        self.intake = DeltaIntake(transport, logger, weights, now, self.roster)
        self.publisher = Publisher.for_config(config, transport, logger, self.state_dir, now)
        self.master_id = master_id(self.state_dir)
        # The repo is looked at every 10 polls, at most a minute apart (a Hub call each time)
        every = max(config.poll_interval, min(60.0, 10 * config.poll_interval))
        sha_of = self.publisher.sha256_of  # what its publish of a state would send
        self.guard = RepoGuard(transport, logger, self.master_id, weights, now, sha_of, every)
        self._restored: MasterState | None = None
        self.throttle = Throttle()  # a failure repeating at every poll: one line a minute
        self.sender: PublishSender | None = None  # publishes off the poll thread when running
        self.lock = threading.Lock()  # rounds vs. checkpoint snapshots from the training thread
        self.fatal: Exception | None = None  # a permanent transport failure, raised in training
        self.polled = False  # a poll read the repo's deltas since the start (the run's end waits)

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
        refuse_another_global_dtype(state, self.publisher.global_dtype)
        try:
            view = self.guard.inspect(with_weights=True, max_bytes=self.intake.max_bytes)
        except Exception as exc:  # the repo is unreachable now: judged at the next poll
            if getattr(exc, "permanent", False):
                raise
            self.logger.warn(unchecked_line(exc, state))
            if state is not None:
                self._resume(state)
            return
        state, publish = self.guard.at_start(state, view, newest_saved_step(self.state_dir))
        publish = publish or run_ended(view.count)  # started again: the run goes on, say so
        if not publish and view.keyframe is not None:
            self.publisher.uploaded = view.keyframe  # read there just now
        # the state's own summary when it has one (older states: the repo's)
        self.intake.nodes = dict((state.nodes if state else None) or view.nodes or {})
        self._resume(state)
        self.guard.last_check = self.clock()
        rate = (view.count or {}).get("fleet_tokens_per_step")  # the pace its state says
        publish = publish or bool(state and state.fleet and rate != round(self.master.fleet_rate))
        if not publish and view.step is not None:  # the repo holds this master's step
            self.publisher.adopt_landed(view.step, view.sha256, view.count, self.intake.nodes)
        if publish:
            self._publish_safely()

    def _resume(self, state: MasterState | None) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # said once, in start()
            self.master = Master(master_config(self.config), self.initial_weights, state)
        self.publisher.restore(state)
        self.roster.restore(self.intake.nodes or (state.nodes if state else {}))
        self.logger.notice(f"diloco master: outer step {self.master.outer_step}")

    def _publish_safely(self) -> None:
        """Publish at start: a transient failure leaves it to the next poll (I5)."""
        try:
            self.republish()
        except Exception as exc:
            if getattr(exc, "permanent", False):
                raise
            self.logger.warn(f"diloco master: publish failed ({exc}); the next poll retries")

    # ------------------------------------------------------------------ one poll

    def poll_once(self, force: bool = False) -> RoundResult | None:
        """Fetch new deltas, offer them, and run (and publish) a round if one is ready.

        ``force``: the end of a run, whatever is pending, publish pacing aside; with nothing
        pending, the current step again if the nodes' summary changed (an end marker)."""
        if not self.guard.checked:  # the repo was unreachable at start: no round before it answers
            self._start_now()
            if not self.guard.checked:
                return None
        if self.sender is not None:
            self.intake.deleted(self.sender.take_landed())
            if self.sender.fatal is not None:
                raise self.sender.fatal
        if self.guard.due():
            check_repo(self.guard, self.publisher, self.intake.max_bytes)
            check_keyframe(self.guard, self.publisher)
        self.master.seen_step = self.publisher.last_step  # staleness: what nodes could see
        self.intake.poll(self.master)
        if not self.polled:  # the repo's backlog is read: later nodes are stragglers
            self.roster.settle_backlog()
        self.polled = True
        if self.publisher.outstanding:  # a saved step the repo lacks: no round before it lands
            if self.sender is None or self.sender.idle():  # its send failed or the repo lost it
                self.republish()
            return None
        if not force and not self.publisher.due():
            return None  # the offered deltas wait for the next poll's round
        result = self._round(force)
        if result is None and force and not self.publisher.exact_at(self.master.outer_step):
            # the last round went out as an update on an older keyframe (it ran before the end
            # was known): one more step, the same weights as a keyframe, so the run ends exact
            result = self._round(force, same=True)
        if result is None and force and self.summary_unpublished():
            self.republish()  # e.g. an end marker (the node has ended), or the run's end
        return result

    def _round(self, force: bool, same: bool = False) -> RoundResult | None:
        """Propose a round (``same``: a step of the same weights), save it, then commit and
        publish it; a failed save drops the proposal (its deltas stay pending for the next
        poll) and names the file."""
        with self.lock:
            result = (
                self.master.propose_same() if same else self.master.propose(self.clock(), force)
            )
        if result is None:
            return None
        nodes = self.intake.summary_after(result)
        consumed = [*self.intake.unusable, *self.intake.paths_of(result.consumed)]
        extra = step_count_extra(nodes, self.master_id, self.guard.base_sha256)
        try:
            shared = self.intake.round_deltas(result.shared)
            publication = self.publisher.save(
                result.state(), consumed, extra, result.fleet_rate, last=force, shared=shared
            )
        except CheckpointError as exc:
            line = self.throttle.line(
                f"diloco master: {exc}; outer step {result.outer_step} is not taken: its "
                f"{len(result.included)} deltas wait for the next poll"
            )
            if line:
                self.logger.warn(line)
            return None
        with self.lock:  # the round and its node summary together, for state_dict's copy
            self.master.commit(result)
            self.intake.consumed(result, nodes)
        log_round(self.logger, self.intake.counters, result, self.transport.stats())
        self._send(publication)
        return result

    def republish(self) -> None:
        """Publish the committed step again (saved with the current node summary): after a
        failed send, a repo that lost it, or a summary change at the end of a run."""
        nodes = self.intake.summary_after(None)
        extra = step_count_extra(nodes, self.master_id, self.guard.base_sha256)
        state, rate = self.master.snapshot(), self.master.fleet_rate
        publication = self.publisher.save(state, list(self.intake.unusable), extra, rate)
        with self.lock:
            self.intake.nodes, self.intake.markers = nodes, {}
        self._send(publication)

    def summary_unpublished(self) -> bool:
        """The step count's ``nodes`` or ``ended`` (the run's end) differ from what landed."""
        return self.publisher.says_otherwise(self.intake.summary_after(None))

    def _send(self, publication: Publication) -> None:
        """Publish a saved step (in the sender's thread when running), deleting every settled
        file; if it fails, it is sent again (the sender) or the next poll publishes again."""
        # also refuses to publish over another master's step
        check_repo(self.guard, self.publisher, self.intake.max_bytes)
        if self.sender is not None:
            self.sender.submit(publication)
            return
        self.publisher.send(publication)
        self.intake.deleted(publication.consumed)

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


def check_repo(guard: RepoGuard, publisher: Publisher, max_bytes: int) -> None:
    """Look at the repo's global (before every publish, and every few polls): whatever
    happened to it is named in one line, and the next publish restores it."""
    expected, saved = publisher.last_count, publisher.saved_step
    if expected is not None and guard.check(expected, saved, max_bytes):
        publisher.repo_lost_it = True  # restored by this poll's publish


def check_keyframe(guard: RepoGuard, publisher: Publisher) -> None:
    """The keyframe the repo's update builds on is master state too (I3): deleted, damaged
    or replaced, the next poll's publish uploads it again (``Publisher._upload_keyframe``)."""
    keyframe = publisher.keyframe
    if keyframe is None or publisher.uploaded != keyframe.path or publisher.repo_lost_it:
        return  # none, or not uploaded yet: the next publish uploads it anyway
    cap, version = len(keyframe.data) + 1, publisher.uploaded_version
    if guard.keyframe_lost(keyframe.path, keyframe.sha256, cap, version):
        publisher.repo_lost_it = True


def log_round(logger: Any, counters: dict[str, int], result: RoundResult, stats: dict) -> None:
    """Count a committed round and log its ``diloco_round`` event (with the transport's stats)."""
    counters["included"] += len(result.included)
    counters["stale"] += len(result.stale)
    logger.log(
        "diloco_round",
        {
            "outer_step": result.outer_step,
            **result.counts,  # this round's; the counters below are totals so far
            "tokens": result.tokens,
            "momentum": result.momentum_applied,
            "momentum_state": result.momentum_state,
            **{f"total_{k}": v for k, v in counters.items()},
            **stats,
        },
    )


class GlobalDtypeChanged(ConfigError):
    """The master's state was published in another ``global_dtype`` (exit 2, at start)."""

    permanent = True  # a poll that meets it stops the master: retrying cannot help


def refuse_another_global_dtype(state: MasterState | None, configured: str) -> None:
    """I3: a step always means the same weights, and another ``global_dtype`` would publish
    other weights (or another keyframe) under the state's step, so a change is refused at
    start, like a worker's ``delta_dtype`` on ``--resume``."""
    saved = None if state is None else state.global_dtype
    if saved is None or saved == configured:
        return
    raise GlobalDtypeChanged(
        f"distributed.global_dtype: {saved} -> {configured} cannot change within a run: this "
        f"master published outer step {state.outer_step} as {saved}",
        hint=f"set distributed.global_dtype back to {saved}; {configured} needs a new run (another "
        "repo and state_dir)",
    )


def unchecked_line(exc: Exception, state: MasterState | None) -> str:
    then = "publishing nothing before" if state is None else "its state stands until"
    return f"diloco master: cannot read the repo at start ({exc}); {then} the next poll reads it"


def step_count_extra(nodes: dict, master: str, base: str | None) -> dict[str, Any]:
    """What a publish's step count says besides the step: the nodes' summary, this master, and
    the frozen base every node must share (``frozen_base``; none: every parameter trains)."""
    extra = {"nodes": nodes, "master": master}
    if base is not None:
        extra[BASE_FIELD] = base
    return extra

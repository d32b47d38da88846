"""The end of a master's run: wait for every node's last delta, run the final round, say what
the final global holds, and leave it in the master's output directory (I6).

A master whose own training has ended (``MasterPlugin``), or a coordinating master that reached
``outer_steps`` or whose whole fleet has ended (``serve``), keeps coordinating until every node
that sent a delta this run has sent its last one (``Roster``), or has been silent past the drain
deadline. Then ``finish`` runs the final round on whatever is pending, never held back by
publish pacing (with an int8 / int4 global whose last round went out as an update, one more step
of the same weights as a keyframe, so the run ends exact), and publishes it, retrying until it
lands or ``upload_timeout_s`` has passed;
one line says what the final global holds, and the ``final_writer`` writes it as a checkpoint.
An interrupted master (Ctrl-C, SIGTERM) does not wait: after its checkpoint it applies what is
in, publishing for at most ``stop_grace_s`` (a second signal: at once), and says which nodes'
last deltas it did not wait for (they stay in the repo for its next start).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from speedtronic.distributed.global_update import Keyframe
from speedtronic.distributed.master.loop import MasterLoop
from speedtronic.distributed.master.outer import MasterState
from speedtronic.distributed.master.state import checked_global_dtype
from speedtronic.distributed.stopping import EndClock, end_clock
from speedtronic.errors import TransportError

FinalWriter = Callable[[dict, int, dict], "Path | None"]  # (weights, outer step, nodes) -> path


def drain(
    loop: MasterLoop,
    should_stop: Callable[[], bool],
    cap_s: float | None = None,
    stragglers: bool = True,
) -> None:
    """Block while the background poll thread runs rounds, until no node is left to wait for
    (``Roster.waiting_for``), ``should_stop()`` says so, or ``cap_s`` (a DDP group's limit).
    A master whose training ended just now (``stragglers``) waits a little for nodes not seen
    yet: one drain deadline when it has heard from no other node (it was started first and its
    fleet is on its way), and ``Roster.join_grace_s`` after the newest node appeared."""
    began, said = time.monotonic(), set()
    pace = min(1.0, loop.config.poll_interval)
    while loop.fatal is None and not should_stop():
        waiting = loop.roster.waiting_for() if loop.polled else ["(the repo)"]
        alone = not any(node != loop.config.node_id for node in loop.roster.nodes)
        if stragglers and alone and time.monotonic() - began < loop.roster.deadline_s():
            _say_once(loop, said, "alone", (
                "diloco master: no other node has announced itself or sent a delta yet; "
                f"waiting up to {loop.roster.deadline_s():.0f} s for one (drain_timeout_s)"
            ))  # fmt: skip
        elif not waiting and not (stragglers and loop.roster.join_grace_s() > 0):
            return
        elif not waiting:
            _say_once(loop, said, "grace", (
                "diloco master: every node it knows of has ended; waiting "
                f"{loop.roster.join_grace_s():.0f} s more for nodes that may still join"
            ))  # fmt: skip
        elif others := _others(loop, waiting):
            _say_once(loop, said, "waiting", (
                f"diloco master: waiting for the last deltas of {', '.join(others)} "
                f"(at most {loop.roster.longest_wait_s():.0f} s more of silence each)"
            ))  # fmt: skip
        else:  # its own node's last delta, sent before the wait: the next poll reads it
            _say_once(loop, said, "own", (
                f"diloco master: waiting for a round to take its own last delta ({waiting[0]})"
            ))  # fmt: skip
        if cap_s is not None and time.monotonic() - began > cap_s:
            loop.logger.warn(f"diloco master: stopped waiting after {cap_s:.0f} s (DDP limit)")
            return
        time.sleep(pace)


def _others(loop: MasterLoop, waiting: list[str]) -> list[str]:
    """The nodes waited for but the master's own (a training master sent its last delta)."""
    return sorted(node for node in waiting if node != loop.config.node_id)


def _say_once(loop: MasterLoop, said: set[str], key: str, line: str) -> None:
    if key not in said:
        said.add(key)
        loop.logger.notice(line)


def finish(loop: MasterLoop, interrupted: bool = False, clock: EndClock | None = None) -> str:
    """The final round, published (retried until it lands, for ``upload_timeout_s``, or what a
    stop's ``clock`` leaves) with ``ended`` in its step count, so a worker started later is told
    there is nothing to join (not when ``interrupted``: a stop is no end); returns the line
    saying what the final global holds. Polls run in this thread from now on."""
    if interrupted and (others := _others(loop, loop.roster.waiting_for())):
        loop.logger.warn(
            f"diloco master: interrupted, so not waiting for the last deltas of "
            f"{', '.join(others)}; they stay in the repo for this master's next start"
        )
    # a stop is not an end: a master interrupted goes on at its next start
    loop.publisher.ending = not interrupted
    deadline = time.monotonic() + max(loop.config.upload_timeout_s, 1.0)
    while True:
        loop.poll_safely(force=True)
        if loop.fatal is not None or not loop.guard.checked:
            break
        done = not loop.unpublished and not loop.master.pending
        if (done and not loop.summary_unpublished()) or time.monotonic() > deadline:
            break
        if clock is not None and clock.left() <= 0:
            break
        time.sleep(min(1.0, loop.config.poll_interval))
    if loop.master is None:
        return "final global: none (the repo never answered)"
    landed = loop.publisher.landed_nodes or {}
    return loop.roster.final_line(loop.publisher.last_step or 0, landed, interrupted)


def serve(
    loop: MasterLoop,
    outer_steps: int,
    stop: threading.Event,
    final_writer: FinalWriter | None = None,
    signals: Any = None,
) -> str | None:
    """Coordinate only (no local training) until the run ends: ``outer_steps`` rounds or the
    whole fleet's last deltas, then every node's last delta or the drain deadline, and
    ``Roster.join_grace_s`` after a node joined (not one in the repo's backlog); or ``stop``
    (a signal: the final round on what is in, within ``stop_grace_s``; ``signals``: a
    ``stopping.Signals``). Returns where the final global was written."""
    loop.start_sending()
    said = False
    try:
        while not stop.is_set():
            loop.poll_safely()
            if loop.fatal is not None:
                raise loop.fatal
            ending = loop.master is not None and (
                loop.master.outer_step >= outer_steps or loop.roster.fleet_ended()
            )
            if ending and loop.polled:
                waiting = loop.roster.waiting_for()
                if not waiting and loop.roster.join_grace_s() == 0:  # stragglers: a little
                    break
                if not said:
                    said = True
                    what = (
                        f"the last deltas of {', '.join(sorted(waiting))}"
                        if waiting
                        else f"{loop.roster.join_grace_s():.0f} s for nodes that may still join"
                    )
                    loop.logger.notice(
                        f"diloco master: outer step {loop.master.outer_step}; waiting for {what}"
                    )
            stop.wait(loop.config.poll_interval)
    finally:
        clock = end_clock(signals, loop.config)
        loop.stop_sending(timeout=clock.limit(loop.config.upload_timeout_s))
    if loop.fatal is not None:
        raise loop.fatal
    line = finish(loop, interrupted=stop.is_set(), clock=clock)
    return _ended(loop, line, final_writer, stopped=stop.is_set())


def _raise_if_unpublished(loop: MasterLoop) -> None:
    """A step saved in state_dir but not in the repo: never exit 0 on that."""
    if loop.unpublished:
        raise TransportError(
            f"diloco master: outer step {loop.master.outer_step} is saved in "
            f"{loop.state_dir} but could not be published",
            hint="start the master again (--resume): it publishes it first",
        )


def _ended(
    loop: MasterLoop, line: str, final_writer: FinalWriter | None, stopped: bool = False
) -> str | None:
    """Say what the final global holds; refuse to exit 0 on a step that never landed; write
    the final global into the output directory. ``stopped`` (a signal): no ``diloco_final``,
    the event of a run that ended, for a stop is not an end (run_end says interrupted)."""
    if loop.fatal is not None:
        raise loop.fatal
    _raise_if_unpublished(loop)
    path = None
    if final_writer is not None and loop.publisher.last_step is not None:
        step = loop.publisher.last_step
        weights = loop.publisher.as_published(loop.master.global_weights, step)
        landed = loop.publisher.landed_nodes or {}
        path = final_writer(weights, step, {"nodes": landed}, landed)
    where = f"; written to {path}" if path else ""
    say = loop.logger.warn if "; missing: " in line else loop.logger.notice
    say(f"diloco master: {line}{where}")
    if not stopped:
        loop.logger.log(
            "diloco_final",
            {"outer_step": loop.publisher.last_step, "path": str(path) if path else None},
        )
    return str(path) if path else None


class MasterPlugin:
    """Trainer plug-in running ``MasterLoop`` beside local training; the run's end at the end."""

    name = "diloco_master"

    def __init__(self, loop: MasterLoop, local_worker: Any = None):
        """``local_worker``: this node's own WorkerPlugin, whose last delta is sent first."""
        self.loop, self.local_worker = loop, local_worker
        self.restored: MasterState | None = None
        self.final_writer: FinalWriter | None = None
        self.drain_cap_s: float | None = None  # a DDP group: the other ranks wait this long
        self.stragglers = True  # wait a little for nodes not seen yet (``drain``)
        self.final_path: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def on_train_start(self, trainer: Any) -> None:
        self.loop.start(self.restored)
        self._thread = self.loop.run_in_background(self._stop)

    def after_optimizer_step(self, trainer: Any) -> None:
        if self.loop.fatal is not None:
            raise self.loop.fatal

    def on_train_end(self, trainer: Any, result: Any) -> None:
        clock = end_clock(trainer, self.loop.config)  # a stop: the grace, after the checkpoint
        if self.local_worker is not None:  # its last delta belongs in the final round
            self.local_worker.finish_sending(trainer, clock)
        status = getattr(result, "status", None)
        interrupted = status == "interrupted"
        if not interrupted:
            stopped = lambda: getattr(trainer, "stop_signal", None) is not None  # noqa: E731
            # a master resumed at max_steps ends with what is there: no stragglers to expect
            stragglers = self.stragglers and status != "at_target"
            drain(self.loop, stopped, self.drain_cap_s, stragglers)
            interrupted = stopped()
        self._stop.set()
        self._thread.join(timeout=clock.limit(max(self.loop.config.poll_interval, 30.0)))
        if self._thread.is_alive():
            self.loop.logger.warn("diloco master: the poll thread is stuck; no final round")
            return
        self.loop.stop_sending(timeout=clock.limit(self.loop.config.upload_timeout_s))
        line = finish(self.loop, interrupted, clock)
        if self.loop.fatal is not None:
            raise self.loop.fatal
        if not self.loop.guard.checked:  # no round could run: the deltas were never applied
            raise TransportError(
                f"diloco master: {self.loop.transport.describe()} never answered, so no delta "
                "was aggregated",
                hint="start the master again once the repo is reachable: the deltas wait there",
            )
        self.final_path = _ended(self.loop, line, self.final_writer, stopped=interrupted)
        if self.local_worker is not None:
            self.local_worker.ended_by_master(self.final_path)

    def on_at_target(self, trainer: Any, result: Any) -> None:
        """``--resume`` of a master whose training is done: its run's end, all the same."""
        if self.local_worker is not None:
            self.local_worker.on_train_start(trainer)
        self.on_train_start(trainer)
        self.on_train_end(trainer, result)

    def state_dict(self) -> dict[str, Any]:
        """A copy of the master state, for a node whose state_dir is lost; never the newest."""
        if self.loop.master is None:
            return {}
        with self.loop.lock:  # the step and the node summary of one round
            state = self.loop.master.snapshot()
            weights = dict(state.global_weights)  # a round replaces them, never in place
            nodes = dict(self.loop.intake.nodes)
            keyframe = self.loop.publisher.keyframe
        extra = {"keyframe_step": keyframe.step, "keyframe": keyframe.weights} if keyframe else {}
        return {
            **extra,
            "outer_step": state.outer_step,
            "weights": weights,
            "optimizer": state.optimizer_state,
            "processed": sorted(state.processed),
            "nodes": nodes,
            "fleet": state.fleet,
            "global_dtype": self.loop.publisher.global_dtype,  # what the step was published in
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
            if "keyframe" in state:  # what the step was published on: a republish is the same
                self.restored.keyframe = Keyframe(state["keyframe_step"], state["keyframe"])
            self.restored.global_dtype = checked_global_dtype(
                state.get("global_dtype"), self.restored.keyframe
            )

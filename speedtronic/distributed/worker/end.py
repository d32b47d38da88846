"""The end of a node's run: its last delta says so, a bounded wait for a global holding it, and
that global written into the node's output directory, with one line saying what it holds (I6).

``RunEnd.run_end`` (the worker plug-in's ``on_train_end``) runs the last boundary with ``final``
set, or, when the run ended on a boundary whose delta went out unmarked, sends an end marker (0
steps); it waits up to ``upload_timeout_s`` for the uploads, then up to the drain deadline
(``distributed.drain_timeout_s``; by default sized from the node's inner loop and the master's
cadence) for a published global whose ``step_count.json`` names this node's last delta. Then it
writes the newest global it has into ``<output_dir>/final_global`` (``final_global``) and says
whether that global holds the node's last delta, or what it lacks and where that work waits.
``at_target`` does the same for ``--resume`` of a node whose training is done: what its
checkpoint holds unsent is sent, and said so; a worker that never reached its repo ends with
exit 1 (``taking_part``). With an int8 / int4 global the last update is within a quantization
step of the master's weights: the wait goes on for the exact final global the master publishes
next, or the line says the copy is not the run's final global.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from speedtronic.distributed.protocol import fleet_totals
from speedtronic.distributed.stopping import EndClock, end_clock
from speedtronic.distributed.worker.fetch import GlobalFetcher, Ready
from speedtronic.distributed.worker.taking_part import unreached_line

WAIT_FLOOR_S, WAIT_CAP_S = 60.0, 3600.0  # the default wait for a global holding the last delta
END_POLL_S = 5.0  # at most this long between looks at the repo while waiting (Hub budgets)


class RunEnd:
    """The end of one worker plug-in's run (``plugin``: its ``WorkerPlugin``)."""

    def __init__(self, plugin: Any):
        self.plugin = plugin
        self.final_writer: Callable[..., Any] | None = None  # (weights, step, facts) -> path
        self.wait_cap_s: float | None = None  # a DDP group: the other ranks wait this long
        self.done = False
        self.final_path: str | None = None
        self.repo_note: str | None = None  # a Hub-spelled spec with no such directory here

    @staticmethod
    def at_max_steps(trainer: Any) -> bool:
        """Whether this boundary is the run's last: the trainer stops at this step."""
        max_steps = getattr(getattr(trainer, "options", None), "max_steps", None)
        return max_steps is not None and trainer.step >= max_steps

    def stop(self, trainer: Any) -> None:
        """A signal stopped the run: its last boundary (marked final), in memory and at once,
        so that the checkpoint written next holds it; nothing is sent yet."""
        self.plugin.status.raise_if_fatal()
        self._last_boundary(trainer, wait=False)

    def _last_boundary(self, trainer: Any, wait: bool) -> None:
        p = self.plugin
        if trainer.step > p.boundary_step:
            p.boundary(trainer, final=True, wait=wait)
        zeros = lambda: {k: torch.zeros(v.shape) for k, v in p.params.items()}  # noqa: E731
        p.uploader.end_run(zeros, max(p.base_outer_step, 0), trainer.step)

    def finish_sending(self, trainer: Any, clock: EndClock | None = None) -> bool:
        """The last boundary for the steps since the previous one (or an end marker), then the
        uploads, for ``upload_timeout_s`` (a stop: its grace); whether everything went out."""
        p = self.plugin
        p.status.raise_if_fatal()
        clock = clock or end_clock(trainer, p.config)
        self._last_boundary(trainer, wait=not clock.stopping)
        if not p.background:
            return p.uploader.send_pending()
        timeout = clock.limit(p.config.upload_timeout_s)
        return p.uploader.drain(timeout, waiting=self._free_records, left=clock.left)

    def _free_records(self) -> None:
        """While the last uploads wait for room: a global the poller fetched frees records."""
        ready = self.plugin.fetcher.ready
        if ready is not None:
            self.plugin.uploader.included(ready.own_seq)

    def run_end(self, trainer: Any, result: Any) -> None:
        p = self.plugin
        p.status.raise_if_fatal()
        if self.done or p.status.stop.is_set():
            return  # already ended, e.g. by the master plug-in of the same node
        clock = end_clock(trainer, p.config)  # a stop: the grace, from now (after the save)
        sent = self.finish_sending(trainer, clock)
        began = time.monotonic()
        ready, holds = self._wait_for_global(sent, clock)
        self.done = True
        p.status.stop.set()
        p.uploader.wake.set()
        p.status.raise_if_fatal()
        if ready is not None:
            p.uploader.included(ready.own_seq)
        if p.uploader.unsent() and result is not None:
            result.unsent = True  # the CLI prints the --resume command that sends them
        if clock.stopping:
            self._say_stopped(trainer, ready, time.monotonic() - began)
        else:
            self._say(ready, holds, sent, time.monotonic() - began)
            if ready is None and not p.counters["uploads"] and p.uploader.unsent() and result:
                result.failure = unreached_line(p)

    def at_target(self, trainer: Any, result: Any) -> None:
        """``--resume`` at max_steps: the run's end all the same, what is unsent sent first."""
        if self.done:
            return
        p = self.plugin
        p.on_train_start(trainer)
        if p.uploader.unsent():
            p.logger.notice(
                f"diloco: training is done (step {trainer.step}); sending the deltas this "
                "node's checkpoint holds unsent"
            )
        self.run_end(trainer, result)

    def ended_by_master(self, path: str | None) -> None:
        """The node's master ran the final round and wrote the final global."""
        self.done, self.final_path = True, path
        self.plugin.status.stop.set()
        self.plugin.uploader.wake.set()

    # ------------------------------------------------------------------ the wait

    def wait_s(self) -> float:
        """``distributed.drain_timeout_s``, or: two polls, the master's publish pacing and two
        inner loops, plus 30 s, within [WAIT_FLOOR_S, WAIT_CAP_S]; a DDP group's cap on top."""
        p = self.plugin
        chosen = getattr(p.config, "drain_timeout_s", None)
        if chosen is None:
            loop = p.config.inner_steps * (p.step_time_s or 0.0)
            pacing = getattr(p.transport, "min_publish_interval_s", 0.0)  # 0 on a directory
            chosen = 2 * p.config.poll_interval + pacing + 2 * loop + 30.0
            chosen = min(WAIT_CAP_S, max(WAIT_FLOOR_S, chosen))
        return chosen if self.wait_cap_s is None else min(chosen, self.wait_cap_s)

    def _wait_for_global(self, sent: bool, clock: EndClock) -> tuple[Ready | None, bool]:
        """The newest global, and whether it holds this node's last delta; waits (bounded, and
        cut by a stop) for one that does when the last delta went out. A fresh fetcher: the
        installed global counts too (the node's weights are not the global's)."""
        p = self.plugin
        last, fetcher = (
            p.uploader.final_seq,
            GlobalFetcher(
                p.config, p.transport, p.logger, p.status, p.params, p.fetcher.base_sha256
            ),
        )
        deadline = time.monotonic() + self.wait_s()
        ready, holds, said = None, False, False
        while clock.left() > 0:
            fetcher.refresh()
            ready = fetcher.ready or ready
            holds = ready is not None and last is not None and ready.own_seq >= last
            approximate = holds and _approximate_end(ready)
            if (holds and not approximate) or not sent or last is None or not p.background:
                return ready, holds
            if p.status.fatal is not None or time.monotonic() >= deadline:
                return ready, holds
            if approximate and not said:  # the master publishes the same weights exact next
                said = True
                p.logger.notice(
                    f"diloco: outer step {ready.outer_step} holds this node's last delta as an "
                    "update within a quantization step; waiting for the master's exact final "
                    "global"
                )
            time.sleep(min(p.config.poll_interval, END_POLL_S, clock.left()))
        return ready, holds

    def _say(self, ready: Ready | None, holds: bool, sent: bool, waited: float) -> None:
        p, last = self.plugin, self.plugin.uploader.final_seq
        where = p.transport.describe()
        if ready is None:
            unsent = (
                f", and this node's deltas are unsent ({where} did not take them): they are in "
                "its checkpoint, --resume sends them"
                if p.uploader.unsent()
                else ""
            )
            line = f"diloco: no global weights in {where} at the end{unsent}; nothing written"
            p.logger.warn(line)
            self._event(None, last, False)
            return
        facts = {"own_seq": ready.own_seq, "last_seq": last, "holds_last_delta": holds}
        facts["exact"] = ready.exact
        if self.final_writer is not None:
            written = self.final_writer(ready.weights, ready.outer_step, facts, ready.nodes)
            self.final_path = str(written)
        written = f"; written to {self.final_path}" if self.final_path else ""
        ended = (ready.ended or fleet_totals(ready.nodes)["ended"]) and ready.exact
        glob = ("the run's final global" if ended else "the global") + (
            f" at outer step {ready.outer_step}"
        )
        if holds:
            p.logger.notice(
                f"diloco: {glob} holds this node's last delta (seq {last}){written}"
                + ("" if ended else self._later(where, ready))
            )
        elif not sent:
            p.logger.warn(
                f"diloco: deltas still unsent at the end ({where} did not take them): they are "
                f"in this node's checkpoint, --resume sends them; {glob} holds this node's "
                f"deltas to seq {ready.own_seq}{written}"
            )
        else:
            rest = (  # the master has ended: no round of this run will take them
                "the master ended the run without the rest, which waits in the repo for it to be "
                "started again (--resume)"
                if ready.ended
                else "the rest waits in the repo for the master"
            )
            p.logger.warn(
                f"diloco: no global holds this node's last delta (seq {last}) after {waited:.0f}"
                f" s; {glob} holds its deltas to seq {ready.own_seq}{written}; {rest}"
            )
        self._event(ready, last, holds)

    def _later(self, where: str, ready: Ready) -> str:
        """How to fetch the run's final global once the master has ended (it has not yet, or
        its exact final global did not come in time)."""
        out = getattr(self.final_writer, "output_dir", None)
        command = f"speedtronic storage pull {out or '<output_dir>'} --repo {where}"
        if _approximate_end(ready):
            return (
                f"; it is not the run's final global: an update within a quantization step of "
                f"the master's weights, which the master publishes exact as its final global: "
                f"`{command}` fetches that into final_global/"
            )
        return (
            f"; the run goes on at the master: once it has ended, `{command}` fetches the run's "
            "final global into final_global/"
        )

    def _say_stopped(self, trainer: Any, ready: Ready | None, waited: float) -> None:
        """A stop (a signal): what of this node's work is not in a global yet, and where it
        waits; no final global is written (the run goes on with --resume)."""
        p = self.plugin
        unsent, out = p.uploader.unsent(), len(p.uploader.in_flight)
        held = f"the global at outer step {ready.outer_step}" if ready else "no global"
        if not unsent and not out:
            p.logger.notice(
                f"diloco: stopped at step {trainer.step}; {held} holds everything this node trained"
            )
        else:
            parts = [f"{out} sent delta(s) wait in {p.transport.describe()} for the master"] * (
                out > 0
            )
            if unsent:
                parts.append(
                    f"the unsent ones are in this node's checkpoint of step {trainer.step}, and "
                    "--resume sends them"
                )
            p.logger.warn(
                f"diloco: stopped at step {trainer.step} after {waited:.0f} s of grace; not yet "
                f"in a global ({held} is the newest this node saw): {'; '.join(parts)}"
            )
        # no diloco_final: that event says the node's run ended, and a stop is not an end
        # (run_end's status "interrupted" records it)

    def _event(self, ready: Ready | None, last: int | None, holds: bool) -> None:
        self.plugin.logger.log(
            "diloco_final",
            {
                "outer_step": ready.outer_step if ready is not None else None,
                "own_seq": ready.own_seq if ready is not None else None,
                "last_seq": last,
                "holds_last_delta": holds,
                "path": self.final_path,
            },
        )


def _approximate_end(ready: Ready) -> bool:
    """Every node has ended, but the global is an int8 / int4 update: the master's final
    global is the same weights exact, one outer step later (``master/loop``)."""
    return not ready.exact and fleet_totals(ready.nodes)["ended"]

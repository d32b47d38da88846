"""The node side of DumbDiLoCo: a Trainer plug-in that trains locally and syncs at boundaries.

Every ``inner_steps`` optimizer steps (a boundary) the plug-in snapshots the weights, computes
the pseudo-gradient against the weights of the last sync (``base - current``) and queues it for
the ``Uploader``'s thread; then it installs the newest global that the ``GlobalFetcher``'s
poller has downloaded and validated, resetting the inner optimizer if configured. With
``install: eager`` a global is installed as soon as it is downloaded, between any two
optimizer steps, carrying the inner loop's progress so far (I2: no local progress is ever
discarded). The training thread never touches the network (I5): a failed or hung upload keeps
its delta in the outbox, where the next boundary's delta is added to it (cumulative, never
lost); the poller just keeps the last good global. The plug-in's state (base weights, the
outbox, counters) goes into the run's checkpoints, so ``--resume`` continues exactly. The end
of its run (``worker/end``): its last delta says so, it waits (bounded) for a global holding
it, and writes that global into its output directory.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
from torch import nn

from speedtronic.distributed.codec import expected_delta_bytes
from speedtronic.distributed.frozen_base import base_sha256
from speedtronic.distributed.latency import poll_advice
from speedtronic.distributed.node_status import NodeStatus
from speedtronic.distributed.transport import Transport
from speedtronic.distributed.worker.end import RunEnd
from speedtronic.distributed.worker.fetch import GlobalFetcher
from speedtronic.distributed.worker.resume import catch_up, replayed
from speedtronic.distributed.worker.taking_part import refuse_to_join
from speedtronic.distributed.worker.upload import Pending, Uploader


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


class WorkerPlugin:
    """Trainer plug-in: boundaries and global installs; the network is its two helpers'."""

    name = "diloco"

    def __init__(
        self,
        config: Any,
        model: nn.Module,
        transport: Transport,
        logger: Any,
        background: bool = True,
        spill_dir: Any = None,
        base: Any = ...,
    ):
        """``background=False``: no threads, the caller drives ``uploader.send_pending`` and
        ``fetcher.refresh`` (simulated clocks). ``spill_dir``: in-flight deltas past memory
        (None: a temporary directory); ``base``: the frozen base's sha256, else the model's."""
        self.config, self.transport, self.logger = config, transport, logger
        self.background = background
        self.params = parameters_of(model)
        self.node_id, self.status = config.node_id, NodeStatus()
        self.uploader = Uploader(config, transport, logger, self.status, spill_dir)
        self.uploader.in_flight.shapes = {k: tuple(p.shape) for k, p in self.params.items()}
        base = base_sha256(model) if base is ... else base  # checked against the run's record
        self.fetcher = GlobalFetcher(config, transport, logger, self.status, self.params, base)
        # global_dtype deltas: a round's own deltas come from what this node sent, not the repo
        self.fetcher.reader.replayer.held = self.uploader.in_flight.held
        self.base: dict[str, torch.Tensor] | None = None
        self.boundary_step = self.boundary_tokens = 0
        self.rate = 0.0  # tokens per step of the last inner loop: this node's pace in the fleet
        self.eager = config.install == "eager"
        self.step_time_s: float | None = None  # measured over the first inner loop
        self._poll_advised = False
        self.install_every = 1  # eager: steps between looks (a DDP node's ranks agree on it)
        self._started: float | None = None  # when training started, to time the first loop
        self._threads: list[threading.Thread] = []
        self.end = RunEnd(self)  # the end of the run: last delta, final global, one line

    @property
    def base_outer_step(self) -> int:
        """The outer step of the global the base came from (-1: none yet)."""
        return self.fetcher.installed_step

    @property
    def fatal(self) -> Exception | None:
        """A permanent transport failure, raised in the training thread."""
        return self.status.fatal

    @property
    def counters(self) -> dict[str, int]:
        return self.status.counters

    # ------------------------------------------------------------------ trainer hooks

    def on_train_start(self, trainer: Any) -> None:
        self._started = time.perf_counter()
        if self.base is None:  # not restored from a checkpoint: start from the newest global
            self._install_latest_global_now()
            self.boundary_step, self.boundary_tokens = trainer.step, trainer.tokens
        else:
            catch_up(self, trainer)
        self.uploader.resumed_step = trainer.step  # a resumed node's checkpoint step
        self.uploader.number_past_used(2 * expected_delta_bytes(self.params, "fp32") + (1 << 20))
        # a run that ends at once needs no announcement (``announce``: a seam for unit tests)
        if getattr(self.config, "announce", True) and not self.end.at_max_steps(trainer):
            self.uploader.hello.ready(trainer.step)
        if not self.background:
            return
        for target in (self.uploader.run, self.fetcher.run):
            name = f"diloco-{type(target.__self__).__name__.lower()}"
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        if self.uploader.unsent():
            self.uploader.wake.set()

    def after_optimizer_step(self, trainer: Any) -> None:
        self.status.raise_if_fatal()
        since = trainer.step - self.boundary_step
        if since >= self.config.inner_steps:
            self.boundary(trainer, final=self.end.at_max_steps(trainer))
        elif self.eager and since % self.install_every == 0 and self.fetcher.ready is not None:
            self.install_eagerly(trainer)

    def on_stop(self, trainer: Any, result: Any) -> None:
        """A signal stopped the run: the last boundary, in memory, before the checkpoint is
        written (it holds the delta); the sending waits for ``on_train_end``, within the grace."""
        self.end.stop(trainer)

    def on_train_end(self, trainer: Any, result: Any) -> None:
        """The end of this node's run (``worker/end``): its last delta, marked so, sent
        (bounded); a bounded wait for a global holding it; that global in the output dir."""
        self.end.run_end(trainer, result)

    def on_at_target(self, trainer: Any, result: Any) -> None:
        """``--resume`` of a node whose training is done: send what is unsent, all the same."""
        self.end.at_target(trainer, result)

    def finish_sending(self, trainer: Any, clock: Any = None) -> bool:
        """The last boundary (or an end marker) and its upload; whether everything went.
        ``clock``: a stop's (``stopping.EndClock``)."""
        return self.end.finish_sending(trainer, clock)

    def ended_by_master(self, path: str | None) -> None:
        """This node's master wrote the final global: nothing left for the worker to do."""
        self.end.ended_by_master(path)

    # ------------------------------------------------------------------ the boundary

    def boundary(self, trainer: Any, final: bool = False, wait: bool = True) -> None:
        """Capture this inner loop's delta, queue it, and install a newer global if there is one.
        ``final``: the last of this node's run (I6); ``wait=False``: never ``sync_wait_s`` (a
        stop)."""
        start = time.perf_counter()
        steps = trainer.step - self.boundary_step
        tokens = trainer.tokens - self.boundary_tokens
        self.rate = tokens / max(steps, 1)
        if not final and self.fetcher.unread_global(self.base_outer_step):
            # The run has a global this node could not read (a master's keyframe lost, or at a
            # resume): a delta on its own weights or its checkpoint's global would reach the
            # master too stale and be dropped. It keeps its base instead, so its work adds up,
            # and the install carries all of it onto the global (I2): its next delta builds on it.
            installed = self.install_ready(trainer, carry_progress=True)
        else:
            self._send_delta(trainer, final)
            if self.config.sync_wait_s > 0 and self.background and wait:
                _wait_for_own_round(self)
            installed = self.install_ready(trainer)
        if self._started is not None:  # the first loop gives the step time: check the budgets
            self.step_time_s, self._started = (start - self._started) / max(steps, 1), None
            for message in self.transport.cadence_warnings(self.config, self.step_time_s):
                self.logger.warn(f"diloco: {message}")
        _advise_poll_interval(self)
        stall = time.perf_counter() - start
        payload = {"step": trainer.step, "stall_s": stall, "installed": installed}
        payload["outer_step"] = self.base_outer_step
        self.logger.log("diloco_boundary", {**payload, **self.counters, **self.transport.stats()})

    def _send_delta(self, trainer: Any, final: bool) -> None:
        """Capture this inner loop's delta (base - current, fp32) and queue it for upload."""
        current = snapshot(self.params)
        delta = {k: self.base[k] - current[k] for k in current}
        self.fetcher.moved(delta)  # how far this node's training went: the globals' bound (I4)
        steps = trainer.step - self.boundary_step
        tokens = trainer.tokens - self.boundary_tokens
        pending = Pending(delta, self.base_outer_step, steps, tokens, 0, "", final, trainer.step)
        if not replayed(pending, self.uploader.replayed_to, self.logger):  # sent before: I1
            self.uploader.queue(pending)
        self.boundary_step, self.boundary_tokens = trainer.step, trainer.tokens
        self.base = current

    def install_eagerly(self, trainer: Any) -> int | None:
        """Between boundaries: install the waiting global now, carrying the progress made since
        the last boundary (new = G + (local - base)), so nothing local is lost (I2)."""
        start = time.perf_counter()
        installed = self.install_ready(trainer, carry_progress=True)
        if installed is not None:
            stall = time.perf_counter() - start
            self.logger.log(
                "diloco_install", {"step": trainer.step, "outer_step": installed, "stall_s": stall}
            )
        return installed

    def install_ready(self, trainer: Any, carry_progress: bool = False) -> int | None:
        """Install a downloaded global newer than the base; its outer step, or None.

        The global lacks this node's deltas it does not name as included (sent since, or not
        sent yet): the master will apply them at the node's share of the fleet, so with
        ``reapply_own_delta`` the node steps from the global by that share of them (``outer_lr``
        x its tokens per step / the fleet's) instead of training on from weights that lack its
        own work.
        """
        ready = self.fetcher.take()
        if ready is None or (ready.outer_step <= self.base_outer_step and not ready.replaces):
            return None
        if ready.replaces:  # the repo went back: the residual corrects deltas it lacks
            why = f"global {ready.outer_step} replaces the one this node built on"
            with self.uploader.lock:
                self.uploader.feedback.reset(why)
        missing = self.uploader.not_included(ready.own_seq)
        progress = None
        if carry_progress:  # what this inner loop has done so far: the next delta holds it
            with torch.no_grad():
                progress = {k: p.detach().float() - self.base[k] for k, p in self.params.items()}
        self._load_weights(ready.weights)
        if missing is not None and ready.fleet_rate and self.config.reapply_own_delta:
            share = self.config.outer_lr * min(1.0, self.rate / ready.fleet_rate)
            _add_to(self.params, missing, -share)
        self.base, self.fetcher.installed_step = snapshot(self.params), ready.outer_step
        if progress is not None:
            _add_to(self.params, progress)
        if self.config.reset_inner_optimizer:
            trainer.optimizer.state.clear()  # AdamW moments were of the old trajectory
        return ready.outer_step

    def _load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, param in self.params.items():
                param.copy_(weights[name].to(param.device, param.dtype))

    # ------------------------------------------------------------------ start-up

    def _install_latest_global_now(self) -> None:
        """At start only: begin from the newest global, if the run has one."""
        self.base = snapshot(self.params)
        try:
            counted = self.transport.read_step_count()
            refuse_to_join(self, counted)  # another base, or a run that ended (permanent)
            self.fetcher.fetch_counted(counted)
        except Exception as exc:  # any transport failure: train from local weights (I5)
            if getattr(exc, "permanent", False):
                raise
            self.logger.warn(f"diloco: no global weights at start ({exc}); using local ones")
            return  # said why: the poller installs the global once it can read it
        ready = self.fetcher.take()
        if ready is None:  # a worker joining a run must not quietly train from scratch
            where = self.transport.describe()
            self.logger.warn(
                f"diloco: no global weights in {where} yet; starting from this "
                "node's own weights until the master publishes one"
            )
            return
        self._load_weights(ready.weights)
        self.base, self.fetcher.installed_step = snapshot(self.params), ready.outer_step
        self.logger.notice(f"diloco: starting from global outer step {ready.outer_step}")

    # ------------------------------------------------------------------ checkpoint state

    def state_dict(self) -> dict[str, Any]:
        return {
            "base": {k: v.cpu() for k, v in (self.base or {}).items()},
            "base_outer_step": self.base_outer_step,
            "boundary": [self.boundary_step, self.boundary_tokens],
            "rate": self.rate,
            **self.uploader.state_dict(),
            "counters": dict(self.counters),
            # the globals' norm bound (I4): fixed for the run, not reset by a resume
            "norm_anchor": [self.fetcher.anchor_norm, self.fetcher.travelled()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        base = state["base"]  # onto the training device, as snapshot() keeps it
        self.base = {k: base[k].to(p.device) for k, p in self.params.items()} if base else None
        self.fetcher.installed_step = int(state["base_outer_step"])
        self.boundary_step, self.boundary_tokens = (int(v) for v in state["boundary"])
        self.rate = float(state.get("rate", 0.0))
        self.fetcher.anchor_norm, self.fetcher.travel = state.get("norm_anchor", [None, 0.0])
        self.uploader.load_state_dict(state)
        self.counters.update(state.get("counters", {}))


def _add_to(params: dict[str, nn.Parameter], tensors: dict[str, torch.Tensor], alpha=1.0) -> None:
    """``param += alpha * tensor`` for every parameter, in the parameter's device and dtype."""
    with torch.no_grad():
        for name, param in params.items():
            param.add_(tensors[name].to(param.device, param.dtype), alpha=alpha)


def _wait_for_own_round(plugin: WorkerPlugin) -> bool:
    """``sync_wait_s``: wait, up to that long, for a global holding this node's newest delta.

    True once the uploader has sent everything and a fetched global's ``step_count`` names
    this node's last sequence number (the master lists each node's latest included delta).
    Polls at most once a second (Hub calls are budgeted); past the deadline the boundary
    goes on asynchronously, as with ``sync_wait_s: 0``.
    """
    deadline = time.monotonic() + plugin.config.sync_wait_s
    pace = min(plugin.config.poll_interval, 1.0)
    plugin.uploader.wake.set()  # the uploader sends now
    while time.monotonic() < deadline and plugin.fatal is None:
        sent = plugin.uploader.all_sent()
        ready = plugin.fetcher.ready
        if sent and ready is not None and ready.own_seq >= plugin.uploader.seq:
            return True
        if sent:
            plugin.fetcher.refresh()
        time.sleep(pace if sent else 0.01)
    return False


def _advise_poll_interval(plugin: WorkerPlugin) -> None:
    """Once three uploads are timed, say if the poll interval adds more waiting for each new
    global than the network does (docs/diloco.md, latency)."""
    timed = plugin.uploader.upload_seconds
    if plugin._poll_advised or len(timed) < 3 or plugin.step_time_s is None:
        return
    plugin._poll_advised = True
    loop_s = plugin.config.inner_steps * plugin.step_time_s
    if advice := poll_advice(plugin.config.poll_interval, sorted(timed)[len(timed) // 2], loop_s):
        plugin.logger.warn(f"diloco: {advice}")

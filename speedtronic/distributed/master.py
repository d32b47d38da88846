"""The master's loop: poll the repo for deltas, run rounds of ``outer.Master``, publish globals.

``MasterLoop`` drives the pure policy object with I/O: every ``poll_interval`` it lists
``nodes/``, fetches only deltas it has not seen (a listed version it already settled costs
nothing, so an idle poll does not grow with history), validates them (``codec``, I4), offers
them, and when a round is ready saves the master state to ``state_dir`` *before* publishing
the new weights and ``step_count.json`` and deleting the consumed deltas (I3: a published step
always has a saved state behind it, so a restart republishes the same weights). It runs in a
background thread during training (``MasterPlugin``) or alone (``serve``, for a master with
``train_locally: false``).
"""

from __future__ import annotations

import hashlib
import threading
import time
import warnings
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from speedtronic.distributed.codec import (
    BadDelta,
    decode_delta,
    decode_weights,
    encode_weights,
    expected_delta_bytes,
)
from speedtronic.distributed.outer import (
    Master,
    MasterConfig,
    MasterState,
    ReceivedDelta,
    RoundResult,
    delta_identity,
)
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, NODE_ID_RE, parse_delta_path
from speedtronic.distributed.transport import DeltaRef, Transport
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
    """Polls, validates, aggregates and publishes; one thread calls ``poll_once`` at a time."""

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
        self.settled_versions: dict[str, str] = {}  # path -> listed version already handled
        self.paths: dict[str, str] = {}  # identity -> repo path, to delete once consumed
        self.unusable: list[str] = []  # paths of settled files to delete with the next publish
        self.ignored: dict[str, str] = {}  # path -> why it is no delta, as logged once
        self.unpublished = False  # a round whose publish failed; the next poll publishes it
        self.counters = {"found": 0, "included": 0, "rejected": 0, "stale": 0, "bytes_down": 0}
        self.nodes: dict[str, dict[str, Any]] = {}  # node -> its newest accepted delta, for status
        # the Hub limits commits per repo, so its transport asks for a pause between publishes
        self.min_publish_interval_s = getattr(transport, "min_publish_interval_s", 0.0)
        self.last_publish = -float("inf")  # on ``clock``
        self.lock = threading.Lock()  # rounds vs. checkpoint snapshots from the training thread
        self.fatal: Exception | None = None  # a permanent transport failure, raised in training

    # ------------------------------------------------------------------ start-up

    def start(self, restored: MasterState | None = None) -> None:
        """Resume the newest of: state_dir, the trainer checkpoint's copy, the repo; publish it."""
        state = MasterState.load(self.state_dir, log=self.logger.warn)
        if restored is not None and (state is None or restored.outer_step > state.outer_step):
            state = restored
        counted = self.transport.read_step_count()
        self.nodes = known_nodes(counted)
        published = self._published_state(counted, state.outer_step if state else -1)
        state = published or state
        policy = master_config(self.config)
        for message in policy.warnings():  # e.g. naive async: said once, in the run's log
            self.logger.warn(f"diloco master: {message}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            self.master = Master(policy, self.initial_weights, state)
        if counted is None or counted["outer_step"] < self.master.outer_step:
            self._save_and_publish(self.master.outer_step, self.master.global_weights, [])
        self.logger.notice(f"diloco master: outer step {self.master.outer_step}")

    def _published_state(self, counted: dict | None, local_step: int) -> MasterState | None:
        """The repo's global, if it is ahead of everything local (a master on a new machine)."""
        if counted is None or counted["outer_step"] <= local_step:
            return None
        data = self.transport.read(GLOBAL_WEIGHTS, self._max_bytes())
        outer_step, weights = decode_weights(data or b"", self.initial_weights)
        self.logger.warn(
            f"diloco master: the repo is at outer step {outer_step}, ahead of {self.state_dir}; "
            "continuing from the published weights (outer momentum starts again from zero)"
        )
        return MasterState(outer_step, weights)

    # ------------------------------------------------------------------ one poll

    def poll_once(self, force: bool = False) -> RoundResult | None:
        """Fetch new deltas, offer them, and run (and publish) a round if one is ready."""
        for ref in self.transport.list_deltas():
            if ref.problem is not None:
                self._ignore(ref)
            elif self.settled_versions.get(ref.path) != ref.version:
                try:
                    self._take(ref)
                except (SpeedtronicError, OSError) as exc:  # one bad read stops no round
                    if getattr(exc, "permanent", False):
                        raise
                    self.logger.warn(f"diloco master: cannot read {ref.path} ({exc}); next poll")
        if not force and self.clock() - self.last_publish < self.min_publish_interval_s:
            return None  # the offered deltas wait for the next poll's round
        with self.lock:
            result = self.master.round(self.clock(), force=force)
        if result is None:
            if self.unpublished:  # the last publish failed: the repo is behind the master
                with self.lock:
                    weights = {k: t.clone() for k, t in self.master.global_weights.items()}
                self._publish(self.master.outer_step, weights)
            return None
        self._count_round(result)
        self.unusable += [self.paths.pop(i) for i in result.consumed if i in self.paths]
        self._publish(result.outer_step, result.weights)
        return result

    def _publish(self, outer_step: int, weights: Tensors) -> None:
        """Publish, deleting every settled file; if it fails, the next poll tries again."""
        self.unpublished = True
        self._save_and_publish(outer_step, weights, self.unusable)
        for path in self.unusable:  # gone: a file uploaded there again is a new one
            self.settled_versions.pop(path, None)
        self.unusable, self.unpublished = [], False

    def _take(self, ref: DeltaRef) -> None:
        """Fetch, validate and offer one listed delta; anything wrong is logged and counted."""
        node_id, seq = parse_delta_path(ref.path)
        if ref.size > self._max_bytes():  # refused unread, and removed with the next publish
            self.settled_versions[ref.path] = ref.version
            self._reject(ref.path, f"{ref.size} bytes, over the {self._max_bytes()} byte cap")
            return
        # A failed read raises before the path is settled: the next poll reads it again (a
        # Hub file's version never changes, so settling first would lose the delta).
        data = self.transport.read(ref.path, self._max_bytes())
        self.settled_versions[ref.path] = ref.version
        if data is None:
            return  # consumed or replaced since the listing
        try:
            self.counters["bytes_down"] += len(data)
            identity = delta_identity(node_id, seq, data)
            self.paths[identity] = ref.path
            if self.master.seen(identity):  # e.g. saved, but the publish deleting it failed
                self.unusable.append(ref.path)  # applied already: delete it with the next publish
                return
            header, tensors = decode_delta(data, ref.path, self.master.global_weights)
            self.counters["found"] += 1
            if self.master.offer(ReceivedDelta(identity, header, tensors), self.clock()) == (
                "stale"
            ):
                self.logger.warn(f"diloco master: {ref.path} is too stale; skipped")
            else:
                self._note_node(header)
        except BadDelta as exc:
            self._reject(ref.path, str(exc))

    def _ignore(self, ref: DeltaRef) -> None:
        """An entry under nodes/ that is no delta: logged once by name, never read (I4)."""
        if self.ignored.get(ref.path) != ref.problem:
            self.ignored[ref.path] = ref.problem
            self.logger.warn(f"diloco master: ignoring {ref.path}: {ref.problem}")

    def _reject(self, path: str, reason: str) -> None:
        self.counters["rejected"] += 1
        self.unusable.append(path)
        self.logger.warn(f"diloco master: rejected {path}: {reason}")

    def _note_node(self, header: Any) -> None:
        """Remember a node's latest accepted delta; ``hub status`` shows it from step_count."""
        self.nodes[header.node_id] = {
            "seq": header.seq,
            "base_outer_step": header.base_outer_step,
            "last_delta_at": header.created_at,
            "tokens": header.tokens,
        }

    def _count_round(self, result: RoundResult) -> None:
        self.counters["included"] += len(result.included)
        self.counters["stale"] += len(result.stale)
        self.logger.log(
            "diloco_round",
            {
                "outer_step": result.outer_step,
                **result.counts,  # this round's; the counters below are totals so far
                "tokens": result.tokens,
                "momentum": result.momentum_applied,
                **{f"total_{k}": v for k, v in self.counters.items()},
                **self.transport.stats(),
            },
        )

    def _save_and_publish(self, outer_step: int, weights: Tensors, consumed: list[str]) -> None:
        self.master.snapshot().save(self.state_dir)  # before publishing: I3
        data = encode_weights(weights, outer_step)
        step_count = {
            "outer_step": outer_step,
            "updated_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "weights_sha256": hashlib.sha256(data).hexdigest(),
            "format": 1,
            "fleet_tokens": self.master.fleet_tokens,  # lets workers re-apply their own delta
            "nodes": self.nodes,
        }
        start = time.perf_counter()
        self.transport.publish(data, step_count, consumed)
        self.last_publish = self.clock()
        self.logger.log(
            "diloco_publish",
            {"outer_step": outer_step, "bytes": len(data), "seconds": time.perf_counter() - start},
        )

    def _max_bytes(self) -> int:
        return 2 * expected_delta_bytes(self.initial_weights, "fp32") + (1 << 20)

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

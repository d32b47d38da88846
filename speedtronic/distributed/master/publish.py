"""The master's publish: save its state, then publish the weights and ``step_count.json``.

A round is committed in one place (issue 27): ``Publisher.save`` writes the round's proposed
state to ``state_dir`` *before* the repo sees the new outer step (I3), and only a saved round is
committed by the master; then the publish, one transport call (the weights, the step count and
the deletes of consumed deltas: one Hub commit, or write-then-rename on a directory). Until it
has landed (``outstanding``) no further round runs, and staleness is measured against the step
that landed (``last_step``), so a step on its way to the repo exists for no one. A failed
publish is sent again (``PublishSender``, or the next poll). It also spaces publishes by the
transport's ``min_publish_interval_s`` (the Hub limits commits per repo); the final round is
never held back. ``PublishSender`` sends saved steps from a thread of its own, so polling goes
on meanwhile. With ``global_dtype`` int8 / int4 a publish is an update on a keyframe
(``global_update``): a new step takes a new keyframe every ``keyframe_every`` outer steps and at
the run's last round, saved with the step; the keyframe is uploaded before the first publish
that names it, and the one it replaces is deleted with that publish. At the run's end
(``ending``) every publish says ``ended`` in its step count: the run's final global is out.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from speedtronic.distributed.global_update import (
    Keyframe,
    as_keyframe,
    encode_global,
    published_weights,
)
from speedtronic.distributed.master.round_publish import Shared, deletes, next_chain
from speedtronic.distributed.master.state import MasterState
from speedtronic.distributed.node_status import Throttle
from speedtronic.distributed.protocol import run_ended
from speedtronic.distributed.round_apply import encode_round_file
from speedtronic.distributed.round_record import RoundChain
from speedtronic.distributed.transport import Transport

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Publication:
    """A saved outer step to publish: its weights (never changed in place: a round makes new
    tensors), the files it deletes, extras."""

    outer_step: int
    weights: Tensors
    consumed: list[str]
    extra: dict[str, Any]
    fleet_rate: int
    keyframe: Keyframe | None = None  # what the weights are published as an update on
    chain: RoundChain | None = None  # global_dtype deltas: the round record published instead


class Publisher:
    """Saves and publishes outer steps; remembers when it last did and whether one failed."""

    def __init__(
        self,
        transport: Transport,
        logger: Any,
        state_dir: Path,
        clock: Callable,
        global_dtype: str = "fp32",
        keyframe_every: int = 10,
    ):
        self.transport, self.logger, self.state_dir, self.clock = (
            transport,
            logger,
            state_dir,
            clock,
        )
        self.global_dtype, self.keyframe_every = global_dtype, keyframe_every
        self.keyframe: Keyframe | None = None  # the newest saved step's
        self.uploaded: str | None = None  # the keyframe path the repo holds, as far as known
        self.uploaded_version: str | None = None  # its transport version, just after upload
        self.superseded: list[str] = []  # keyframes of ours to delete with the next publish
        self.chain: RoundChain | None = None  # global_dtype deltas: the newest saved step's
        self.restored_step = -1  # a loaded state's step: saved, so it keeps its keyframe
        # the Hub limits commits per repo, so its transport asks for a pause between publishes
        self.min_interval_s = getattr(transport, "min_publish_interval_s", 0.0)
        self.last_publish = -float("inf")  # on ``clock``
        # What the repo should hold: the step and weights sha256 this master last published
        self.last_step: int | None = None
        self.last_sha: str | None = None
        self.last_count: dict[str, Any] | None = None  # the whole step count: the repo's look
        self.saved_step: int | None = None  # the newest step saved to state_dir
        self.repo_lost_it = False  # the repo no longer holds last_step: publish it again
        self.landed_nodes: dict[str, Any] | None = None  # step_count's ``nodes`` that landed
        # the run's end (``master/plugin.finish``): every publish from now on says ``ended``, so
        # a worker that starts later knows at once there is nothing to join (issue 55)
        self.ending = False
        # one publish at a time: a send left running by a timed-out close and the final
        # synchronous publish would otherwise race, and an older step could land last
        self.sending = threading.Lock()

    @classmethod
    def for_config(
        cls, config: Any, transport: Transport, logger: Any, state_dir: Path, clock: Callable
    ) -> Publisher:
        """A publisher with the ``distributed`` section's ``global_dtype`` and
        ``keyframe_every`` (simulations and tests pass configs that predate them)."""
        dtype = getattr(config, "global_dtype", "fp32")
        every = getattr(config, "keyframe_every", 10)
        return cls(transport, logger, state_dir, clock, dtype, every)

    @property
    def unpublished(self) -> bool:
        """A saved step the repo does not hold: newer than the last landed, or lost since.
        Derived, not a flag, so a send landing an older step cannot clear a newer step's."""
        behind = self.saved_step is not None and (
            self.last_step is None or self.last_step < self.saved_step
        )
        return behind or self.repo_lost_it

    def due(self) -> bool:
        """Whether a round may publish now (``min_publish_interval_s`` since the last one)."""
        return self.clock() - self.last_publish >= self.min_interval_s

    @property
    def outstanding(self) -> bool:
        """A saved step is on its way to the repo: rounds wait until it lands (issue 27)."""
        return self.unpublished

    def publish(
        self, state: MasterState, consumed: list[str], extra: dict[str, Any], fleet: float
    ) -> None:
        """Save ``state``, then publish its weights at its outer step, deleting ``consumed``;
        ``extra`` joins the step count. Raises when it did not land."""
        self.send(self.save(state, consumed, extra, fleet))

    def save(
        self,
        state: MasterState,
        consumed: list[str],
        extra: dict[str, Any],
        fleet: float,
        last: bool = False,
        shared: Shared | None = None,
    ) -> Publication:
        """Save ``state`` (I3: before the repo sees its step; raises CheckpointError naming
        the file when it cannot) and return what to send; ``fleet`` is the fleet's pace,
        ``last``: the run's last round (a new step then is a keyframe: the run ends exact);
        ``shared``: with global_dtype deltas, the round's lr and deltas (``round_publish``)."""
        state.nodes = extra.get("nodes", {})
        state.keyframe = self.keyframe_for(state, last)
        state.global_dtype = self.global_dtype
        chain = None
        if self.global_dtype == "deltas":
            chain = next_chain(self.chain, state, state.keyframe, shared, last)
            consumed = deletes(self.chain, chain, list(consumed))
            state.round_chain = chain
        state.save(self.state_dir)
        self.saved_step, self.keyframe = state.outer_step, state.keyframe
        self.chain = chain
        weights, keyframe = state.global_weights, state.keyframe
        return Publication(
            state.outer_step, weights, list(consumed), extra, round(fleet), keyframe, chain
        )

    def keyframe_for(self, state: MasterState, last: bool = False) -> Keyframe | None:
        """The keyframe ``state``'s publish builds on: its own if it has one (a loaded state),
        else the newest one unless a new step is due one. A step already saved keeps its
        keyframe, so a republish gives the same bytes (I3)."""
        if self.global_dtype == "fp32":
            return None
        if state.keyframe is not None:
            return state.keyframe
        current, step = self.keyframe, state.outer_step
        new_step = step > max(
            self.restored_step, -1 if self.saved_step is None else self.saved_step
        )
        if current is None or (new_step and (last or step - current.step >= self.keyframe_every)):
            return as_keyframe(state.global_weights, step)
        return current

    def exact_at(self, outer_step: int) -> bool:
        """Whether nodes read ``outer_step``'s global as the master's weights exactly: full
        weights (fp32), or a step published on a keyframe of itself (with deltas: and no round
        left for nodes to replay, so the run's end deletes every delta)."""
        keyframe = self.keyframe
        if self.global_dtype == "deltas" and self.chain is not None and self.chain.rounds:
            return False  # exact, but deltas wait in the repo: the run's end takes a keyframe
        return self.global_dtype == "fp32" or keyframe is None or keyframe.step == outer_step

    def adopt_landed(self, step: int, sha256: str, count: dict, nodes: dict) -> None:
        """At start, the repo already holds this master's ``step`` (no publish needed): take it
        as the last landed one; ``count`` is the whole step count, for the periodic look."""
        self.last_step, self.last_sha, self.last_count = step, sha256, count
        self.landed_nodes = dict(nodes)

    def restore(self, state: MasterState | None) -> None:
        """A loaded state's keyframe is the one its step was published on."""
        if state is not None and self.global_dtype != "fp32":
            self.keyframe, self.restored_step = state.keyframe, state.outer_step
            self.chain = state.round_chain

    def sha256_of(self, state: MasterState) -> str:
        """The sha256 of what a publish of ``state`` sends to ``global/latest.safetensors``."""
        keyframe = self.keyframe_for(state)
        if self.global_dtype == "deltas":
            chain = state.round_chain or next_chain(self.chain, state, keyframe, None)
            return hashlib.sha256(encode_round_file(chain)).hexdigest()
        data = encode_global(state.global_weights, state.outer_step, keyframe, self.global_dtype)
        return hashlib.sha256(data).hexdigest()

    def send(self, publication: Publication) -> bool:
        """Publish a saved step: weights and step_count together, consumed deltas deleted.
        False when a newer step landed meanwhile: the older one is never sent over it (I3)."""
        with self.sending:
            if self.last_step is not None and publication.outer_step < self.last_step:
                return False  # superseded; the newer publish deleted what it would delete
            self._send(publication)
        return True

    def says_otherwise(self, nodes: dict[str, Any]) -> bool:
        """Whether a publish now would say other things of the run than the step count that
        landed: other ``nodes``, or whether the run has ended (``ending``)."""
        return nodes != (self.landed_nodes or {}) or run_ended(self.last_count) != self.ending

    def as_published(self, weights: Tensors, outer_step: int) -> Tensors:
        """The weights nodes read for ``weights`` published at ``outer_step`` on the newest
        keyframe: within a quantization step of them, or them exactly (fp32, a keyframe)."""
        keyframe = self.keyframe
        if keyframe is None or keyframe.step == outer_step or self.global_dtype == "deltas":
            return weights  # deltas: every node repeats the master's arithmetic exactly
        data = encode_global(weights, outer_step, keyframe, self.global_dtype)
        return published_weights(data, keyframe, weights)

    def _send(self, publication: Publication) -> None:
        outer_step, keyframe = publication.outer_step, publication.keyframe
        if publication.chain is not None:
            data = encode_round_file(publication.chain)
        else:
            data = encode_global(publication.weights, outer_step, keyframe, self.global_dtype)
        step_count = {
            "outer_step": outer_step,
            "updated_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "weights_sha256": hashlib.sha256(data).hexdigest(),
            "format": 1,
            # the fleet's pace: a node reapplies its deltas a global lacks at its share of it
            "fleet_tokens_per_step": publication.fleet_rate,
            **publication.extra,
        }
        if self.ending:  # read at the send: one saved before the end and sent after says it too
            step_count["ended"] = True
        start = time.perf_counter()
        sent = self._upload_keyframe(keyframe) + len(data)
        self.transport.publish(data, step_count, [*publication.consumed, *self.superseded])
        self.superseded = []
        self.last_publish, self.repo_lost_it = self.clock(), False
        self.last_step, self.last_sha = outer_step, step_count["weights_sha256"]
        self.last_count = step_count
        self.landed_nodes = dict(publication.extra.get("nodes") or {})
        self.logger.log(
            "diloco_publish",
            {"outer_step": outer_step, "bytes": sent, "seconds": time.perf_counter() - start},
        )

    def _upload_keyframe(self, keyframe: Keyframe | None) -> int:
        """Upload ``keyframe`` unless the repo holds it (bytes sent); the one it replaces is
        deleted with the publish that first names the new one."""
        if keyframe is None or (keyframe.path == self.uploaded and not self.repo_lost_it):
            return 0
        self.transport.upload(keyframe.path, keyframe.data)
        if self.uploaded not in (None, keyframe.path):
            self.superseded.append(self.uploaded)
        self.uploaded, self.uploaded_version = keyframe.path, self._version_of(keyframe.path)
        return len(keyframe.data)

    def _version_of(self, path: str) -> str | None:
        """The version of the file just uploaded, where the transport says one: the periodic
        look (``RepoGuard.keyframe_lost``) then knows it without downloading it."""
        version_of = getattr(self.transport, "file_version", None)
        try:
            return None if version_of is None else version_of(path)
        except Exception:  # the upload landed: a failed look only costs one read later
            return None


class PublishSender:
    """Sends saved steps from a thread of its own, so a publish (seconds to minutes of upload on
    a slow link) never holds up the master's polls. Only the newest step waiting is sent: an
    older one it supersedes is skipped, its deletes carried over. A failed send is retried
    after ``retry_s``; a permanent failure is kept in ``fatal`` for the poll thread to raise.
    ``landed`` holds the deletes of sends that landed, for the poll thread to settle.
    """

    def __init__(self, publisher: Publisher, logger: Any, retry_s: float):
        self.publisher, self.logger, self.retry_s = publisher, logger, retry_s
        self.waiting: Publication | None = None
        self.landed: list[str] = []
        self.fatal: Exception | None = None
        self.busy = False
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.throttle = Throttle()
        self.thread = threading.Thread(target=self._run, name="diloco-publish", daemon=True)
        self.thread.start()

    def submit(self, publication: Publication) -> None:
        """Send ``publication`` next, in place of (and with the deletes of) one waiting."""
        with self.lock:
            if self.waiting is not None:
                consumed = dict.fromkeys([*self.waiting.consumed, *publication.consumed])
                publication = replace(publication, consumed=list(consumed))
            self.waiting = publication
        self.wake.set()

    def idle(self) -> bool:
        with self.lock:
            return self.waiting is None and not self.busy

    def take_landed(self) -> list[str]:
        with self.lock:
            landed, self.landed = self.landed, []
        return landed

    def close(self, timeout: float) -> None:
        """Let the sends waiting finish (up to ``timeout``), then stop the thread."""
        deadline = time.monotonic() + timeout
        while not self.idle() and self.fatal is None and time.monotonic() < deadline:
            time.sleep(0.01)
        self.stop.set()
        self.wake.set()
        self.thread.join(timeout=max(0.0, deadline - time.monotonic()) + 1.0)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.wake.wait()
            self.wake.clear()
            with self.lock:
                publication, self.waiting = self.waiting, None
                self.busy = publication is not None
            if publication is None or self._send(publication):
                continue
            self.stop.wait(self.retry_s)
            with self.lock:  # back in line, under a newer step if one came meanwhile
                self.waiting = publication if self.waiting is None else self.waiting
                if self.waiting is not publication:
                    merged = dict.fromkeys([*publication.consumed, *self.waiting.consumed])
                    self.waiting = replace(self.waiting, consumed=list(merged))
                self.busy = False  # only now: close() must not see it idle while it retries
            self.wake.set()

    def _send(self, publication: Publication) -> bool:
        """Whether it is done with: landed or superseded (``busy`` cleared), or failed."""
        try:
            landed = self.publisher.send(publication)
        except Exception as exc:  # anything: the thread lives on and retries (I5)
            if getattr(exc, "permanent", False):
                self.fatal = self.fatal or exc
                self.stop.set()
            elif line := self.throttle.line(f"diloco master: publish failed ({exc}); retrying"):
                self.logger.warn(line)
            return False
        with self.lock:
            self.busy = False
            if landed:
                self.landed += publication.consumed
        return True

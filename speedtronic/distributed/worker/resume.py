"""A node's place in the run across restarts: its numbering, what a resumed node must not send
twice (I1), and the announcement that its run has begun (I6).

A node numbers its deltas past every one it ever used (its deltas in the repo, its newest the
master applied), so a reused name never meets an old file. A node resumed from a checkpoint
trains again the steps its previous process trained after that checkpoint, and that process
may have sent them: every delta names its chain and the optimizer step its inner loop ended at
(``end_step``), so the resumed node finds how far its chain got (its deltas past the
checkpoint's number in the repo, and the master's summary of its newest applied one) and drops
the inner loops it trains again up to there instead of sending them a second time. It also
starts on the run's newest global (``catch_up``), carrying what it restored. At its
start a node uploads ``nodes/<id>/node.json`` (``Announcement``): a master whose own run ends
first then waits for this node's last delta, though none of its deltas has arrived yet.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from speedtronic.distributed.protocol import (
    STEP_COUNT,
    BadDelta,
    DeltaHeader,
    delta_path,
    leaves_room,
    node_file_path,
    parse_delta_path,
)


class Announcement:
    """``nodes/<id>/node.json`` for an ``Uploader`` (``up``): sent by its thread before the next
    delta; a failure is tried again with the next send, and blocks no delta."""

    def __init__(self, up: Any):
        self.up = up
        self.data: bytes | None = None  # waiting to go out

    def ready(self, started_step: int) -> None:
        """This node's run begins at ``started_step``: say so with the next send."""
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"node_id": self.up.node_id, "chain": self.up.chain, "started_at": stamp}
        self.data = json.dumps({**body, "step": started_step}).encode() + b"\n"
        self.up.wake.set()

    def send(self) -> None:
        data = self.data
        if data is None:
            return
        try:
            self.up.transport.upload(node_file_path(self.up.node_id), data)
        except Exception as exc:  # noqa: BLE001 - tried again with the next send
            self.up.status.stop_if_permanent(exc)
            return
        if self.data is data:
            self.data = None


def number_past_used(up: Any, max_bytes: int) -> None:
    """Set ``up.seq`` (an ``Uploader``) past every number the node used; after a resume, set
    ``up.replayed_to``. ``max_bytes`` caps the read of one of its deltas."""
    try:
        refs = up.transport.list_deltas()
        counted = up.transport.read_step_count() or {}
    except Exception as exc:  # any transport failure: number on from the checkpoint
        if getattr(exc, "permanent", False):
            raise
        _unsettled(up, max_bytes, f"cannot list the repo ({exc})")
        return
    own = (counted.get("nodes") or {}).get(up.node_id) or {}
    applied = own.get("seq")
    if applied is not None and not leaves_room(applied):  # a writer's, not the master's
        up.logger.warn(
            f"diloco: {STEP_COUNT} says this node's newest applied delta is {applied}, "
            "which leaves no room to number on (18 digits); ignored"
        )
        applied = None
    mine = [parse_delta_path(r.path) for r in refs if r.problem is None]
    used = [seq for node, seq in filter(None, mine) if node == up.node_id and leaves_room(seq)]
    if up.resumed_seq is not None:
        later = [seq for seq in used if seq > up.resumed_seq]
        reached = _reached(up, own, later, max_bytes)
        if reached is None:
            _unsettled(up, max_bytes, "cannot read its deltas in the repo")
            return
        up.replayed_to = reached
        _drop_landed_exact(up, own, used)
        if up.replayed_to:
            _drop_sent_outbox(up)
    up.seq = max([up.seq, *used, *([applied] if applied is not None else [])])
    up.unsettled = None


def catch_up(plugin: Any, trainer: Any) -> None:
    """A resumed node installs the newest global before its first step, carrying the progress
    it restored (I2): the run moved on while it was down, and a delta built on its checkpoint's
    global would reach the master more than ``max_staleness`` outer steps old and be dropped
    with all its steps (issue 47's chaos run lost 120 of 1,800 steps so)."""
    try:
        plugin.fetcher.fetch_newer()
    except Exception as exc:  # a transport failure: the poller installs it once it can (I5)
        if getattr(exc, "permanent", False):
            raise
        plugin.fetcher.behind_base = plugin.base_outer_step  # its deltas wait (I2 carries them)
        plugin.logger.warn(f"diloco: cannot read the newest global at resume ({exc}); this "
                           "node's deltas wait until the poller installs it")  # fmt: skip
        return
    installed = plugin.install_eagerly(trainer)
    if installed is not None:
        plugin.logger.notice(f"diloco: resumed on global outer step {installed}")


def settled(up: Any) -> bool:
    """Whether a resumed node knows what its previous process sent (the uploader's thread asks
    before each send, and looks again while it does not): until then nothing goes out, since a
    replayed inner loop sent again under its old name with other bytes would count twice (I1)."""
    if up.unsettled is not None:
        number_past_used(up, up.unsettled)
    return up.unsettled is None


def _unsettled(up: Any, max_bytes: int, why: str) -> None:
    if up.resumed_seq is None:  # a fresh node: only its numbering is at stake
        up.logger.warn(f"diloco: {why}; numbering from {up.seq}")
        return
    if up.unsettled is None:
        up.logger.warn(
            f"diloco: {why}; this resumed node sends nothing until it can tell what its "
            "previous process sent (I1), and keeps training"
        )
    up.unsettled = max_bytes


def _reached(up: Any, own: dict, later: list[int], max_bytes: int) -> int | None:
    """The optimizer step up to which the node's previous process sent inner loops of this
    chain after the checkpoint: from its newest applied delta and its deltas still waiting;
    None when one of those cannot be read now (it cannot be told apart: ask again later)."""
    reached = []
    if own.get("chain") == up.chain and (own.get("seq") or 0) > up.resumed_seq:
        reached.append(own.get("end_step", 0))
    for seq in later:
        try:
            data = up.transport.read(delta_path(up.node_id, seq), max_bytes)
        except Exception as exc:  # noqa: BLE001 - transient: the caller asks again later
            if getattr(exc, "permanent", False):
                raise
            return None
        header = header_of(data) if data else None
        if header is not None and header.chain == up.chain:
            reached.append(header.end_step)
    return max([0, *reached])


def _drop_landed_exact(up: Any, own: dict, used: list[int]) -> None:
    """A delta the checkpoint caught in flight (``exact``) that landed after all: in the repo
    still, or applied (the master names it, or a later one of this chain). Sent again, it
    would only stay in the repo of a master that has ended (a resumed finished master)."""
    exact = up.exact
    if exact is None or not exact.seq:
        return
    applied = own.get("chain") == up.chain and (own.get("seq") or 0) >= exact.seq
    if applied or exact.seq in used:
        up.exact = None


def _drop_sent_outbox(up: Any) -> None:
    outbox = up.outbox
    if outbox is not None and outbox.end_step <= up.replayed_to:
        up.outbox = None  # the previous process sent it (with what followed)
    # the checkpoint's residual went out with the first of those inner loops: sent again, it
    # would count twice (the previous process's newer residual is lost with it)
    up.feedback.reset("the previous process sent it after the checkpoint")
    step, to = up.resumed_step, up.replayed_to
    at = f" of step {step}" if step is not None else ""
    if step is not None and to <= step:  # nothing past the checkpoint: what it held unsent
        what = f"the inner loops the checkpoint held unsent (to step {to})"
    else:
        what = f"its inner loops up to step {to}"
    up.logger.warn(
        f"diloco: after the checkpoint{at}, this node's previous process sent {what}; they are "
        "not sent again (I1)"
    )


def replayed(pending: Any, replayed_to: int, logger: Any) -> bool:
    """Whether a boundary's ``pending`` delta is one the previous process sent already: it is
    then dropped, not sent twice; of one that overlaps the end of what was sent, the steps
    past it are lost with the previous process (said in a warning)."""
    if pending.end_step - pending.steps >= replayed_to:
        return False
    if pending.end_step > replayed_to:
        lost = pending.end_step - replayed_to
        logger.warn(
            f"diloco: the inner loop to step {pending.end_step} overlaps what the previous "
            f"process sent (to step {replayed_to}); its last {lost} steps are dropped"
        )
    return True


def header_of(data: bytes) -> DeltaHeader | None:
    """The header of a delta this node sent (its safetensors metadata), or None."""
    try:
        size = int.from_bytes(data[:8], "little")
        meta = json.loads(data[8 : 8 + size]).get("__metadata__")
        return DeltaHeader.from_metadata(meta)
    except (ValueError, AttributeError, BadDelta):
        return None

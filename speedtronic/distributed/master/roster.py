"""What the master knows of each node of the run: its last delta, whether its run has ended,
when it was last heard from, and which of its deltas a round could not use (I6).

The end of a run is a protocol event: a node's last delta says so (``DeltaHeader.final``).
``Roster`` keeps, per node, the newest delta the master has seen and the sequence number of its
last one, and says which nodes the master must still wait for at the end: a node that sent a
delta this run and has not sent its last one, unless it has been silent for longer than the
drain deadline. It also says, in the one line a master prints at the end, what the final global
holds: every node and its last sequence number, or which node's work is missing and why. The
drain deadline's default comes from the fleet's pace as the master sees it (``deadline_s``).
Restored from the state's node summary, a restarted master knows which nodes had ended already.
Stdlib only; the wall clock is passed in (a node's silence is measured in seconds of it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

DEADLINE_FLOOR_S = 60.0  # a default drain deadline is never shorter (a loaded machine, a slow link)
DEADLINE_CAP_S = 3600.0  # nor longer: a node silent for an hour is not coming back for this run
DEADLINE_UNKNOWN_S = 600.0  # nothing observed of the fleet's pace yet
LOOPS_OF_SILENCE = 4  # a node is given up on after this many of its inner loops without a word
# Nodes started together appear within seconds of each other on a quiet machine, and 17 s
# apart were measured on a loaded one: a master waits this long after the newest for stragglers
JOIN_GRACE_S = 30.0


@dataclass
class NodeRecord:
    """One node as the master has seen it this run (or as its state's summary said)."""

    node_id: str
    last_seq: int = -1  # the newest delta seen
    final_seq: int | None = None  # its last delta of the run, once seen
    heard_at: float | None = None  # wall clock when the newest delta was seen (or sent)
    gaps: list[float] = field(default_factory=list)  # seconds between its deltas (its clock)
    created: float | None = None  # the newest delta's ``created_at``
    dropped: dict[int, str] = field(default_factory=dict)  # seq -> why no round used it
    ended_before: bool = False  # the state's summary said its last delta was applied

    @property
    def ended(self) -> bool:
        """Its last delta is in (no newer one since: a resumed node runs on)."""
        return self.final_seq is not None and self.last_seq <= self.final_seq


class Roster:
    """Every node of the run, for the master's end: whom to wait for, and what is missing."""

    def __init__(self, wall: Callable[[], float] = time.time, poll_interval: float = 60.0):
        self.wall, self.poll_interval = wall, poll_interval
        self.nodes: dict[str, NodeRecord] = {}
        self.started_at = wall()
        self.joined_at: float | None = None  # when the newest node was first seen
        self.deadline_setting: float | None = None  # distributed.drain_timeout_s; None: auto

    def restore(self, summary: dict[str, dict[str, Any]]) -> None:
        """Nodes from the state's summary (a restarted master): who had ended, when heard."""
        for node_id, info in (summary or {}).items():
            record = self.nodes.setdefault(node_id, NodeRecord(node_id))
            seq = info.get("seq", -1)
            record.last_seq = max(record.last_seq, seq)
            if info.get("final"):
                record.final_seq, record.ended_before = seq, True
            record.heard_at = record.heard_at or _parse_time(info.get("last_delta_at"))

    def joined(self, node_id: str) -> bool:
        """The node's announcement was seen (its run has begun): it is waited for at the end
        like a node that sent deltas; whether it had ended already (its announcement is then
        a leftover, to delete)."""
        record = self.nodes.get(node_id)
        if record is None:
            self.nodes[node_id] = NodeRecord(node_id, heard_at=self.wall())
            self.joined_at = self.wall()
            return False
        return record.ended

    def heard(
        self,
        node_id: str,
        seq: int,
        final: bool = False,
        dropped: str | None = None,
        created_at: str | None = None,
    ) -> None:
        """A delta of ``node_id`` was seen: offered to a round, or dropped (``dropped``: why).
        ``created_at`` (its header's) gives the node's pace: the time between its deltas by its
        own clock, whatever the master's polls and pauses did to their arrival."""
        if node_id not in self.nodes:
            self.joined_at = self.wall()
        record = self.nodes.setdefault(node_id, NodeRecord(node_id))
        now, created = self.wall(), _parse_time(created_at)
        if seq > record.last_seq and created is not None and record.created is not None:
            record.gaps = [*record.gaps[-15:], max(0.0, created - record.created)]
        if seq >= record.last_seq:
            record.last_seq, record.heard_at = seq, now
            record.created = created if created is not None else record.created
        if final:
            record.final_seq, record.ended_before = seq, False
        if dropped is not None:
            record.dropped[seq] = dropped

    # ------------------------------------------------------------------ the end

    def deadline_s(self, node: NodeRecord | None = None) -> float:
        """How long a node may stay silent at the end before its work is called missing:
        ``distributed.drain_timeout_s``, or LOOPS_OF_SILENCE of the node's inner loops as the
        master sees them (the fleet's slowest when it has none yet) plus two polls, within
        [DEADLINE_FLOOR_S, DEADLINE_CAP_S]; DEADLINE_UNKNOWN_S before any pace is known."""
        if self.deadline_setting is not None:
            return self.deadline_setting
        own = statistics.median(node.gaps) if node is not None and node.gaps else None
        paces = [statistics.median(r.gaps) for r in self.nodes.values() if r.gaps]
        loop = own if own is not None else max(paces, default=None)
        if loop is None:
            return DEADLINE_UNKNOWN_S
        wanted = LOOPS_OF_SILENCE * loop + 2 * self.poll_interval
        return min(DEADLINE_CAP_S, max(DEADLINE_FLOOR_S, wanted))

    def settle_backlog(self) -> None:
        """The first poll is over. If every node it found had ended (a master started again
        after its fleet ended), none of them calls for a wait for stragglers; a fleet still
        running when the master started (it booted later than its workers) does."""
        if all(record.ended for record in self.nodes.values()):
            self.joined_at = None

    def join_grace_s(self) -> float:
        """How much longer to wait for a node not seen yet: ``JOIN_GRACE_S`` (at least three
        polls, at most the drain deadline) after the newest node appeared; 0 once past."""
        if self.joined_at is None:
            return 0.0
        grace = min(self.deadline_s(), max(JOIN_GRACE_S, 3 * self.poll_interval))
        return max(0.0, grace - (self.wall() - self.joined_at))

    def silence(self, node: NodeRecord) -> float:
        """Seconds since the node was last heard from (since this master started, if never)."""
        return self.wall() - (node.heard_at if node.heard_at is not None else self.started_at)

    def waiting_for(self) -> list[str]:
        """Nodes whose last delta has not arrived and that are not yet past the deadline."""
        return [
            r.node_id
            for r in self.nodes.values()
            if not r.ended and self.silence(r) <= self.deadline_s(r)
        ]

    def fleet_ended(self) -> bool:
        """At least one node is known and none is left to wait for: the run is over."""
        return bool(self.nodes) and not self.waiting_for()

    def longest_wait_s(self) -> float:
        """The longest the master may still wait at the end (for the log line that says so)."""
        waits = [self.deadline_s(r) - self.silence(r) for r in self.nodes.values() if not r.ended]
        return max([0.0, *waits])

    def final_line(
        self, outer_step: int, summary: dict[str, dict[str, Any]], interrupted: bool = False
    ) -> str:
        """What the final global holds, in one line: every node's last delta, or what is not
        and why (``interrupted``: a signal cut the master's wait short)."""
        held, missing = [], []
        for node_id in sorted(self.nodes):
            record, info = self.nodes[node_id], summary.get(node_id) or {}
            applied = info.get("seq")
            held.append(f"{node_id} seq {applied if applied is not None else 'none'}")
            if problem := self._problem(record, applied, interrupted):
                missing.append(f"{node_id} {problem}")
        head = f"final global outer step {outer_step}"
        if not self.nodes:
            return f"{head}: no node sent a delta"
        if not missing:
            return f"{head} holds every node's last delta: {', '.join(held)}"
        return f"{head} holds {', '.join(held)}; missing: {'; '.join(missing)}"

    def _problem(self, record: NodeRecord, applied: int | None, interrupted: bool) -> str | None:
        dropped = sorted(record.dropped.items())
        if not record.ended:
            silent = self.silence(record)
            since = _clock_text(record.heard_at) if record.heard_at is not None else "the start"
            why = self._unwaited(record, silent, interrupted)
            newest = f"newest seq {record.last_seq}" if record.last_seq >= 0 else "no delta yet"
            return f"sent no last delta ({newest}; silent since {since}, {silent:.0f} s, {why})"
        if applied is None or applied < record.final_seq:
            why = record.dropped.get(record.final_seq, "not in a published round")
            return f"last delta seq {record.final_seq} not applied ({why})"
        if dropped:
            listed = ", ".join(f"seq {s} ({why})" for s, why in dropped[:3])
            more = f" and {len(dropped) - 3} more" if len(dropped) > 3 else ""
            return f"deltas not applied: {listed}{more}"
        return None

    def _unwaited(self, record: NodeRecord, silent: float, interrupted: bool) -> str:
        """Why the master ended without a node's last delta, as it happened: a silence past
        the deadline, a signal, its newest delta refused, or a delta after the wait ended (a
        DDP group's cap; the master's own node, resumed, sending after its wait)."""
        deadline = self.deadline_s(record)
        if silent > deadline:
            return f"past the {deadline:.0f} s drain deadline"
        if interrupted:
            return "the master did not wait: interrupted"
        if (refused := record.dropped.get(record.last_seq)) is not None:
            return f"seq {record.last_seq} {refused}"
        return "it came after the master's wait had ended"


def _parse_time(text: Any) -> float | None:
    """A header's ``created_at`` (``%Y-%m-%dT%H:%M:%SZ``) as a wall-clock time, or None."""
    try:
        stamp = datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return stamp.replace(tzinfo=timezone.utc).timestamp()


def _clock_text(wall: float) -> str:
    return datetime.fromtimestamp(wall, timezone.utc).strftime("%H:%M:%S UTC")

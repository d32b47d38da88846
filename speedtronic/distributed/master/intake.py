"""The master's intake: list ``nodes/``, fetch the deltas it has not seen, validate, offer.

``DeltaIntake.poll`` lists the repo and, for every delta whose listed version it has not
settled, reads it, validates it (``codec``, I4) and offers it to the ``outer.Master``. A listed
version already settled costs nothing, so an idle poll does not grow with history. What is
wrong is logged by name and counted: a bad delta is rejected (its file deleted with the next
publish), an entry that is no delta is logged once and never read, one unreadable delta stops
no round. It also keeps each node's newest applied delta, for ``step_count.json``, and tells
the ``Roster`` every delta it sees (the end of a run: whose last delta is in, I6).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from speedtronic.distributed.codec import BadDelta, decode_delta, expected_delta_bytes
from speedtronic.distributed.master.outer import ReceivedDelta, RoundResult, delta_identity
from speedtronic.distributed.master.roster import Roster
from speedtronic.distributed.protocol import (
    ANNOUNCEMENT,
    DeltaHeader,
    announced_node,
    parse_delta_path,
)
from speedtronic.distributed.round_record import RoundDelta
from speedtronic.distributed.transport import DeltaRef, Transport


class DeltaIntake:
    """What the master has seen in the repo: settled versions, paths to delete, counters."""

    def __init__(
        self, transport: Transport, logger: Any, weights: dict, clock: Callable, roster: Roster
    ):
        self.transport, self.logger, self.clock, self.roster = transport, logger, clock, roster
        self.max_bytes = 2 * expected_delta_bytes(weights, "fp32") + (1 << 20)
        self.settled_versions: dict[str, str] = {}  # path -> listed version already handled
        self.paths: dict[str, str] = {}  # identity -> repo path, to delete once consumed
        self.sizes: dict[str, int] = {}  # identity -> bytes (a round record names them)
        self.unusable: list[str] = []  # paths of settled files to delete with the next publish
        self.ignored: dict[str, str] = {}  # path -> why it is no delta, as logged once
        self.counters = {"found": 0, "included": 0, "rejected": 0, "stale": 0, "bytes_down": 0}
        self.nodes: dict[str, dict[str, Any]] = {}  # node -> newest applied delta (step_count)
        self.headers: dict[str, Any] = {}  # identity -> header of a delta waiting for a round
        self.markers: dict[str, DeltaHeader] = {}  # node -> its end marker, for the next summary
        self.announced: dict[str, str] = {}  # node -> its node.json, deleted once it has ended

    def poll(self, master: Any) -> None:
        """Offer ``master`` every new delta listed in the repo."""
        for ref in self.transport.list_deltas():
            if ref.problem == ANNOUNCEMENT:
                self._announce(ref)
            elif ref.problem is not None:
                self._ignore(ref)
            elif self.settled_versions.get(ref.path) != ref.version:
                try:
                    self._take(ref, master)
                except Exception as exc:  # one bad read stops no round
                    if getattr(exc, "permanent", False):
                        raise
                    self.logger.warn(f"diloco master: cannot read {ref.path} ({exc}); next poll")

    def summary_after(self, result: RoundResult | None) -> dict[str, dict[str, Any]]:
        """Each node's newest applied delta once ``result`` is committed (step_count's
        ``nodes``: a node reapplies the ones it lacks), with the end markers seen since."""
        nodes = dict(self.nodes)
        included = [] if result is None else result.included
        headers = [h for h in map(self.headers.get, included) if h is not None]
        for header in sorted([*headers, *self.markers.values()], key=lambda h: h.seq):
            before = nodes.get(header.node_id) or {}
            if before.get("seq", -1) > header.seq:
                # Applied after a later one of its node (its first read failed) or an old
                # marker: the newest stays named, or a node resumed from a checkpoint before
                # the later ones would not see them and send their inner loops again (I1)
                nodes[header.node_id] = _counted(before, header)
                continue
            entry = {
                "seq": header.seq,
                "base_outer_step": header.base_outer_step,
                "last_delta_at": header.created_at,
                "tokens": header.tokens,
                "final": header.final,
            }
            if header.steps == 0:  # an end marker: the work is the previous delta's
                entry.update({k: before[k] for k in ("base_outer_step", "tokens") if k in before})
            entry.update({"end_step": header.end_step} if header.end_step else {})
            entry.update({"chain": header.chain} if header.chain else {})
            totals = {k: before[k] for k in ("steps_total", "tokens_total") if k in before}
            nodes[header.node_id] = _counted({**entry, **totals}, header)
        return nodes

    def consumed(self, result: RoundResult, nodes: dict[str, dict[str, Any]]) -> None:
        """A round settled these (its state saved): their files go with the next publish, and
        ``nodes`` (``summary_after``) is what step_count names from now on."""
        identities = result.consumed
        self.unusable += [self.paths.pop(i) for i in identities if i in self.paths]
        self.nodes, self.markers = nodes, {}
        for identity in result.stale:
            if (h := self.headers.get(identity)) is not None:
                self.roster.heard(h.node_id, h.seq, h.final, "too stale", h.created_at)
        for identity in identities:
            self.headers.pop(identity, None)
            self.sizes.pop(identity, None)

    def round_deltas(self, shared: tuple | None) -> tuple[float, list[RoundDelta]] | None:
        """A round's (lr, (identity, coefficient) ...) as the deltas its record names."""
        if shared is None:
            return None
        lr, coefs = shared
        deltas = [
            RoundDelta(self.paths[i], i.rsplit("/", 1)[1], self.sizes[i], coef) for i, coef in coefs
        ]
        return lr, deltas

    def paths_of(self, identities: list[str]) -> list[str]:
        """The repo paths of these deltas (to delete with the publish that settles them)."""
        return [self.paths[i] for i in identities if i in self.paths]

    def deleted(self, paths: list[str]) -> None:
        """A publish deleted these: a file uploaded there again is a new one."""
        for path in paths:
            self.settled_versions.pop(path, None)
        self.unusable = [p for p in self.unusable if p not in set(paths)]

    def _take(self, ref: DeltaRef, master: Any) -> None:
        """Fetch, validate and offer one listed delta; anything wrong is logged and counted."""
        node_id, seq = parse_delta_path(ref.path)
        if ref.size > self.max_bytes:  # refused unread, and removed with the next publish
            self.settled_versions[ref.path] = ref.version
            self._reject(ref.path, f"{ref.size} bytes, over the {self.max_bytes} byte cap")
            return
        # A failed read raises before the path is settled: the next poll reads it again (a
        # Hub file's version never changes, so settling first would lose the delta).
        data = self.transport.read(ref.path, self.max_bytes)
        self.settled_versions[ref.path] = ref.version
        if data is None:
            return  # consumed or replaced since the listing
        try:
            self.counters["bytes_down"] += len(data)
            identity = delta_identity(node_id, seq, data)
            self.paths[identity], self.sizes[identity] = ref.path, len(data)
            if master.seen(identity):  # e.g. saved, but the publish deleting it failed
                self.unusable.append(ref.path)  # applied already: delete it with the next publish
                return
            header, tensors = decode_delta(data, ref.path, master.global_weights)
            self.counters["found"] += 1
            outcome = master.offer(ReceivedDelta(identity, header, tensors), self.clock())
        except BadDelta as exc:
            self.roster.heard(node_id, seq, dropped=f"rejected: {exc}")
            self._reject(ref.path, str(exc))
            return
        self._offered(ref.path, identity, header, outcome)

    def _announce(self, ref: DeltaRef) -> None:
        """A node's run has begun (``nodes/<id>/node.json``, never read): wait for its end."""
        if self.settled_versions.get(ref.path) == ref.version:
            return
        self.settled_versions[ref.path] = ref.version
        node = announced_node(ref.path)
        self.announced[node] = ref.path
        if self.roster.joined(node):
            self._ended(node)

    def _ended(self, node: str) -> None:
        """The node's run is over: its announcement goes with the next publish."""
        if node in self.announced:
            self.unusable.append(self.announced.pop(node))

    def _offered(self, path: str, identity: str, header: DeltaHeader, outcome: str) -> None:
        if header.final:
            self._ended(header.node_id)
        node, seq, final, created = header.node_id, header.seq, header.final, header.created_at
        if outcome == "stale":
            self.logger.warn(f"diloco master: {path} is too stale; skipped")
            self.roster.heard(node, seq, final, "too stale", created)
            return
        self.roster.heard(node, seq, final, created_at=created)
        if outcome == "end":  # settled at once: deleted with the next publish
            self.unusable.append(self.paths.pop(identity, path))
            self.markers[header.node_id] = header
        else:
            self.headers[identity] = header

    def _ignore(self, ref: DeltaRef) -> None:
        """An entry under nodes/ that is no delta: logged once by name, never read (I4)."""
        if self.ignored.get(ref.path) != ref.problem:
            self.ignored[ref.path] = ref.problem
            self.logger.warn(f"diloco master: ignoring {ref.path}: {ref.problem}")

    def _reject(self, path: str, reason: str) -> None:
        self.counters["rejected"] += 1
        self.unusable.append(path)
        self.logger.warn(f"diloco master: rejected {path}: {reason}")


def _counted(entry: dict[str, Any], header: DeltaHeader) -> dict[str, Any]:
    """``entry`` with ``header``'s work added to the node's totals (a marker carries none)."""
    steps, tokens = (header.steps, header.tokens) if header.steps > 0 else (0, 0)
    totals = {"steps_total": entry.get("steps_total", 0) + steps}
    return {**entry, **totals, "tokens_total": entry.get("tokens_total", 0) + tokens}

"""The master's publish to a Hub repo: one commit, on the head it last saw, never over another's.

``Publisher.publish`` commits the weights, ``step_count.json`` and the deletes of the consumed
deltas in one commit whose parent is the last head seen, after checking with one ``paths-info``
call that the step count there is one this node read or wrote (any other is downloaded: another
master at or past our outer step is an error; an older one is taken as ours from then on).
When workers' uploads moved the head under it the commit is refused (412) and rebuilt on the
new head at once: a head moved only by commits under ``nodes/`` (the step count there is still
one this node read or wrote) cannot conflict with a publish of ``global/``, so it never counts
toward giving up (issue 26: a busy fleet starved publishes). Only ``global/`` changing under it
(``MAX_PUBLISH_ATTEMPTS`` step counts not its own) or ``PUBLISH_BUDGET_S`` of refusals end the
attempts. A publish sent again after a failure whose commit had in fact landed (its answer lost
and the landing not yet visible when looked for) is recognised by the step count at the head:
one this node sent with the same content but its time stamp is that publish, landed, and it is
not committed a second time. Every ``squash_every`` publishes it squashes the history; a failed
squash is only a warning. No torch here.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

from speedtronic.distributed.hub.rates import CommitRates
from speedtronic.distributed.hub.view import RepoView, Tally, read_step_count_at
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, STEP_COUNT, check_deletable
from speedtronic.errors import TransportError
from speedtronic.hub.errors import CommitConflict
from speedtronic.hub.files import git_blob_oid

MAX_PUBLISH_ATTEMPTS = 5  # heads whose step count was not ours (global/ changed), in one publish
PUBLISH_BUDGET_S = 300.0  # how long one publish rebuilds on heads that nodes' commits moved


class Publisher:
    """Publishes through ``client`` (a ``HubClient``), keeping a transport's ``view``, ``counts``
    (publishes, publish_conflicts, squashes, squash_failures) and ``rates`` up to date; a failed
    squash goes to ``warn``."""

    def __init__(
        self,
        client: Any,
        view: RepoView,
        counts: Tally,
        rates: CommitRates,
        warn: Callable[[str], None],
        squash_every: int = 0,
    ):
        self.client, self.repo_id = client, client.repo_id
        self.node_id: str = client.node_id or ""
        self.view, self.counts, self.rates, self.warn = view, counts, rates, warn
        self.squash_every = squash_every
        # the step counts this node sent, by git blob id: what each one published (see _landed)
        self._sent: dict[str, tuple[bytes, dict[str, Any]]] = {}

    def publish(self, weights: bytes, step_count: dict[str, Any], consumed: list[str]) -> None:
        """One commit: the weights, ``step_count.json`` and deletes of the consumed deltas."""
        outer_step = step_count["outer_step"]
        body = json.dumps(step_count, indent=2).encode() + b"\n"
        adds = {GLOBAL_WEIGHTS: weights, STEP_COUNT: body}
        message = commit_message(self.node_id, f"publish outer step {outer_step}")
        parent = self.view.head
        # a retried commit of ours may land late: its step count is not another master's
        oid = git_blob_oid(body)
        self.view.own(oid)
        self._sent[oid] = (body, _content(step_count))
        if parent is None:
            parent = self.view.current_head(self.client)
        clock = getattr(getattr(self.client, "budget", None), "clock", time.time)
        deadline, changed = clock() + PUBLISH_BUDGET_S, 0
        while True:
            deletes, moved, found = self._deletable(parent, outer_step, consumed)
            landed = self._landed(found, step_count, weights)
            if landed is not None and not deletes:  # else its deletes are still to commit
                self.view.published(parent, parent, landed, [])
                self._settled()
                return
            changed += moved
            if changed > MAX_PUBLISH_ATTEMPTS:
                raise TransportError(
                    f"could not publish outer step {outer_step} to {self.repo_id}: "
                    f"{STEP_COUNT} changed under {MAX_PUBLISH_ATTEMPTS} publishes in a row; "
                    "the next round tries again"
                )
            try:
                head = self.client.commit(adds, deletes, message, parent=parent)
            except CommitConflict:
                self.counts.add("publish_conflicts")
                if clock() >= deadline:
                    raise TransportError(
                        f"could not publish outer step {outer_step} to {self.repo_id}: the repo "
                        f"kept moving under it for {PUBLISH_BUDGET_S:.0f} s; the next round "
                        "tries again"
                    ) from None
                parent = self.view.current_head(self.client)  # again at once: nodes/ moved it
                continue
            break
        self.view.published(parent, head, body, deletes)
        self._settled()
        if self.squash_every > 0 and self.counts.snapshot()["publishes"] % self.squash_every == 0:
            self._squash(outer_step)

    def _landed(self, found: dict, step_count: dict[str, Any], weights: bytes) -> bytes | None:
        """The step count in ``found`` (``paths_info`` at the parent) if it is one this node sent
        for this very publish (the same content, bar the time stamp each send takes anew) beside
        these very weights; else None (a global damaged since is published again)."""
        counted, stored = found.get(STEP_COUNT), found.get(GLOBAL_WEIGHTS)
        sent = self._sent.get(counted.oid) if counted is not None else None
        if sent is None or sent[1] != _content(step_count) or stored is None:
            return None
        if stored.sha256 is not None:
            same = stored.sha256 == hashlib.sha256(weights).hexdigest()
        else:
            same = stored.oid == git_blob_oid(weights)
        return sent[0] if same else None

    def _settled(self) -> None:
        """A publish landed: counted; its sends are nothing to look for any more."""
        self.counts.add("publishes")
        self.rates.committed()
        self._sent.clear()

    def _deletable(
        self, parent: str, outer_step: int, consumed: list[str]
    ) -> tuple[list[str], bool, dict]:
        """Consumed paths present at ``parent``, after checking no other master published there,
        whether ``global/`` changed there (a step count not ours), and what ``paths_info`` found.

        One ``paths_info`` call answers both: the step count's version (one we read or wrote
        means no other master; any other is downloaded and compared) and which deltas exist.
        """
        wanted = [check_deletable(p) for p in dict.fromkeys(consumed)]  # deltas only
        found = self.client.paths_info([STEP_COUNT, GLOBAL_WEIGHTS, *wanted], parent)
        counted = found.get(STEP_COUNT)
        moved = counted is not None and not self.view.is_own(counted.oid)
        if moved:
            self._check_no_other_master(parent, outer_step)
        return [p for p in wanted if p in found], moved, found

    def _check_no_other_master(self, revision: str, outer_step: int) -> None:
        theirs = read_step_count_at(self.client, revision)
        if theirs.value is not None and theirs.value["outer_step"] >= outer_step:
            raise TransportError(
                f"another master published outer step {theirs.value['outer_step']} to "
                f"{self.repo_id}; only one master may run",
                hint="stop the other master (or give this run its own repo), then restart",
            )
        if theirs.oid is not None:
            self.view.own(theirs.oid)

    def _squash(self, outer_step: int) -> None:
        try:
            self.client.squash(
                commit_message(self.node_id, f"squash history at outer step {outer_step}")
            )
        except (TransportError, OSError) as exc:
            # The publish landed; an unsquashed history only costs storage until the next try
            self.counts.add("squash_failures")
            self.warn(f"{self.repo_id}: history squash failed ({exc})")
            return
        self.view.forget()  # squashing rewrites every commit: the revisions cached are gone
        self.rates.committed()
        self.counts.add("squashes")


def _content(step_count: dict[str, Any]) -> dict[str, Any]:
    """What a step count publishes: all of it but ``updated_at``, which each send sets anew."""
    return {k: v for k, v in step_count.items() if k != "updated_at"}


def commit_message(node_id: str, what: str) -> str:
    """A commit's message: the node that made it, then what it does."""
    return f"{node_id}: {what}" if node_id else what

"""Commits to main that land exactly once, although an answer may be lost on the way.

``Commits.commit`` sends one commit under the request policy. When an attempt's answer is lost
after it was sent (5xx, timeout, dropped connection), the next attempt first looks for the
commit in main's recent history by the random id in its description (``COMMIT_ID_KEY``) and
returns its sha if it landed; the repeat is sent with the head just seen as parent, so a late
landing shows up as a 412 (looked for again), never as a second commit. A 412 on the caller's
own ``parent`` is ``CommitConflict``. Every landed commit is counted in the budget.
"""

from __future__ import annotations

import secrets
import time

from huggingface_hub import CommitOperationAdd, CommitOperationDelete
from huggingface_hub import utils as hf_utils

from speedtronic.distributed.hub.errors import CommitConflict, HubError, Transient
from speedtronic.distributed.hub.policy import RequestPolicy
from speedtronic.distributed.hub.reads import Reads
from speedtronic.distributed.hub.wording import Op

# In each commit's description: a lost commit is looked for by it (its files may be gone since)
COMMIT_ID_KEY = "speedtronic-commit-id"
_LOOKUP_SKEW_S = 600.0  # how much older than the first attempt the history is searched
_LOOKUP_PAGES = 10  # ... and at most this many pages of it (the commits endpoint pages by 50)


class Commits:
    """Commits to ``reads``' repo under ``policy``."""

    def __init__(self, reads: Reads, policy: RequestPolicy):
        self.reads, self.policy = reads, policy
        self.repo_id = reads.repo_id

    def commit(self, adds: dict[str, bytes], deletes: list[str], message: str, parent=None) -> str:
        """One commit of ``adds`` and ``deletes`` to main; returns the new head sha (see the
        module's docstring for lost answers and conflicts)."""
        op = Op("cannot commit to", self.repo_id, write=True)
        pin = {"parent": parent, "lost": False, "check": False}  # lost: ever; check: pending
        commit_id, started = secrets.token_hex(12), time.time()
        description = f"{COMMIT_ID_KEY}: {commit_id}"

        def attempt() -> str:
            if pin["check"]:
                landed, head = self.landed(commit_id, started)
                if landed:
                    return self._counted(landed)
                if parent is not None and head != parent:
                    moved = self.policy.wording.message(
                        op, 412, f"main is at {head[:12]} now", "commit conflict on"
                    )
                    raise CommitConflict(moved, status=412)
                pin["parent"], pin["check"] = head, False
            try:
                sha = self._commit_once(adds, deletes, message, description, pin["parent"])
            except Exception as exc:
                err = self.policy.classifier.classify(exc, op)
                if isinstance(err, CommitConflict) and pin["lost"]:  # ours, landing late?
                    err = Transient(412, "the head moved", ambiguous=True)
                if isinstance(err, Transient) and err.ambiguous:
                    pin["lost"] = pin["check"] = True
                raise err from exc
            return self._counted(sha)

        try:
            return self.policy.run(op, attempt)
        except HubError as exc:
            if not pin["lost"]:
                raise
            read = Op("cannot read", self.repo_id)
            landed = self.policy.run(read, lambda: self.landed(commit_id, started))[0]
            if landed is None:  # still unknown: the caller must send these same bytes again
                exc.maybe_landed = True
                raise
            return self._counted(landed)

    def _counted(self, sha: str) -> str:
        self.policy.budget.count_commit()
        return sha

    def _commit_once(self, adds, deletes, message: str, description: str, parent) -> str:
        # Fresh operation objects each attempt: the library marks them as used.
        ops: list = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=d) for p, d in adds.items()]
        ops += [CommitOperationDelete(path_in_repo=p) for p in deletes]
        return self.reads.api.create_commit(
            self.repo_id,
            ops,
            commit_message=message,
            commit_description=description,
            parent_commit=parent,
        ).oid

    def landed(self, commit_id: str, since: float) -> tuple[str | None, str]:
        """(sha of the commit carrying ``commit_id`` or None, main's head), from main's history
        back to ``since`` less a margin for clock skew; usually one request."""
        url: str | None = f"{self.reads.endpoint}/api/models/{self.repo_id}/commits/main"
        head, pages = None, 0
        while url and pages < _LOOKUP_PAGES:
            (page, url), pages = self.reads.page(url, None), pages + 1
            for item in page:
                head = head or item["id"]
                if commit_id in f"{item.get('title', '')}\n{item.get('message') or ''}":
                    return item["id"], head
                if hf_utils.parse_datetime(item["date"]).timestamp() < since - _LOOKUP_SKEW_S:
                    return None, head
        return None, head or self.reads.head()

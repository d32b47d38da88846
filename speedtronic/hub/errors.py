"""The Hub transport's errors, for every layer above ``hub.client`` to catch without importing it.

``HubError`` says whether retrying can help (``permanent``) and whether a commit may have
landed although its answer was lost (``maybe_landed``); ``RepoNotFound`` and ``CommitConflict``
are the two cases callers handle by name. Stdlib only.
"""

from __future__ import annotations

from speedtronic.errors import TransportError


class HubError(TransportError):
    """A Hub request failed. ``permanent``: retrying cannot help (401, 403, no repo, no token),
    so a node stops; anything else is retried by the caller later. ``maybe_landed``: a commit
    whose last answer was lost and could not be found; send the same bytes again, never others.
    """

    def __init__(
        self, message: str, *, status=None, permanent=False, hint=None, maybe_landed=False
    ):
        super().__init__(message, hint)
        self.status, self.permanent = status, permanent  # status: int | None
        self.maybe_landed = maybe_landed


class RepoNotFound(HubError):
    """The repo does not exist, or the token cannot see it (private repos look absent)."""


class CommitConflict(HubError):
    """412: ``parent_commit`` is not the head of main any more."""


class Transient(Exception):
    """Inside ``HubClient`` only: worth repeating; ``ambiguous``: a commit that may have landed,
    its answer lost."""

    def __init__(self, status, detail: str, wait_s=None, ambiguous: bool = False):
        super().__init__(detail)
        self.status, self.detail, self.wait_s, self.ambiguous = status, detail, wait_s, ambiguous

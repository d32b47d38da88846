"""The object-storage transport's errors, for every layer above the client to catch by name.

``S3Error`` says whether retrying can help (``permanent``: 403, no bucket, no credentials, so a
node stops) and whether a write may have landed although its answer was lost
(``maybe_landed``: send the very same bytes again, never others). ``PreconditionFailed`` is a
conditional request refused (412, or S3's 409 for a conditional write racing another): the
optimistic concurrency of the ``step_count.json`` pointer. ``NOT_MODIFIED`` is what a GET
with ``If-None-Match`` gives back when nothing changed (304). Stdlib only.
"""

from __future__ import annotations

from speedtronic.errors import TransportError

NOT_MODIFIED = object()  # a conditional GET's answer: the object still has the version named


class S3Error(TransportError):
    """A request to the store failed; ``status`` and ``code`` are the store's answer, if any."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        permanent: bool = False,
        maybe_landed: bool = False,
    ):
        super().__init__(message)
        self.status, self.code, self.permanent = status, code, permanent
        self.maybe_landed = maybe_landed


class PreconditionFailed(S3Error):
    """The object is not the version the request named. ``after_lost``: an earlier attempt of
    the same write lost its answer, so the version there may be this very write."""

    after_lost = False


class Unsupported(S3Error):
    """The store refuses a request feature (501 NotImplemented), e.g. conditional writes."""

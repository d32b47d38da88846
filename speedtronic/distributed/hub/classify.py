"""Which failures of a Hub request are worth repeating: an exception in, the one to raise out.

``Classifier.classify`` turns what huggingface_hub and httpx2 raise into ``Transient`` (timeouts,
dropped connections, 5xx, 408, 429 with the wait the server asked for, garbled answers: the
policy retries these) or a one-line ``HubError`` (401, 403, 404, 400, no token: ``permanent``,
retrying cannot help; 412: ``CommitConflict``). A write whose answer was lost after it was sent
is ``ambiguous``: the commit may have landed. Anything else is no Hub failure and is returned
as it is, a bug to see rather than to retry.
"""

from __future__ import annotations

import httpx2
from huggingface_hub import errors as hf_errors
from huggingface_hub import utils as hf_utils

from speedtronic.distributed.hub.errors import (
    CommitConflict,
    HubError,
    RepoNotFound,
    Transient,
    commit_request,
)
from speedtronic.distributed.hub.wording import Op, Wording

_NOT_SENT = (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)
_NETWORK = (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError)
TOKEN_HINT = "set HF_TOKEN to a valid token, or run: hf auth login"
WRITE_HINT = "use a token with write access to the repo (see: speedtronic hub grant)"


class Missing(HubError):
    """404 EntryNotFound: no such path at that revision (callers answer None or [])."""


class Classifier:
    """Failures of one repo's requests, worded by ``wording``."""

    def __init__(self, repo_id: str, wording: Wording):
        self.repo_id, self.wording = repo_id, wording

    def classify(self, exc: Exception, op: Op) -> Exception:
        """The exception to raise for ``exc``: ``Transient`` (retry) or a ``HubError``."""
        if isinstance(exc, (Transient, HubError)):
            return exc
        if isinstance(exc, hf_errors.HfHubHTTPError) and exc.response is not None:
            return self._http(exc, op)
        detail = self.wording.detail(f"{type(exc).__name__}: {exc}")
        if isinstance(exc, _NETWORK):
            sent = not isinstance(exc, _NOT_SENT)
            return Transient(None, detail, ambiguous=op.write and sent and commit_request(exc))
        if isinstance(exc, RuntimeError) and "client has been closed" in str(exc):
            # huggingface_hub closes its shared session after a connection error in any
            # thread's request: this one picked up the closed session and was never sent
            return Transient(None, detail)
        if isinstance(exc, hf_errors.LocalTokenNotFoundError):
            message = self.wording.message(op, None, "no token found")
            return HubError(message, hint=TOKEN_HINT, permanent=True)
        if isinstance(exc, (hf_errors.OfflineModeIsEnabled, hf_errors.HFValidationError)):
            message = self.wording.message(op, None, self.wording.detail(str(exc)))
            return HubError(message, permanent=True)
        if isinstance(exc, (ValueError, KeyError, TypeError, httpx2.DecodingError)):
            # a garbled answer (a proxy's HTML page, a cut body): retried; a commit may have landed
            detail = self.wording.detail(f"unreadable answer: {type(exc).__name__}: {exc}")
            return Transient(None, detail, ambiguous=op.write)
        return exc  # not a Hub failure: a bug to see, not to retry

    def _http(self, exc: hf_errors.HfHubHTTPError, op: Op) -> Exception:
        response = exc.response
        status, code = response.status_code, response.headers.get("X-Error-Code")
        detail = self.wording.detail(exc.server_message or str(exc))
        message = self.wording.message
        if status in (408, 429) or status >= 500:
            ambiguous = op.write and status >= 500 and commit_request(exc)
            return Transient(status, detail, server_wait(response), ambiguous)
        if status == 412:
            return CommitConflict(message(op, status, detail, "commit conflict on"), status=412)
        if code == "RepoNotFound" or (status == 404 and code is None):  # user/org ops catch it
            hint = f"create it with: speedtronic hub init {self.repo_id}"
            text = message(op, status, detail, "cannot find repo")
            return RepoNotFound(text, status=status, hint=hint, permanent=True)
        if code == "EntryNotFound":
            return Missing(message(op, status, detail), status=status)
        what, hint = {
            401: ("token rejected by the Hub for", TOKEN_HINT),
            403: ("token cannot write to" if op.write else "token cannot read", WRITE_HINT),
        }.get(status, (None, None))
        permanent = status in (400, 401, 403)  # a revision squashed away: read at a newer one
        text = message(op, status, detail, what)
        return HubError(text, status=status, hint=hint, permanent=permanent)


def server_wait(response: httpx2.Response) -> float | None:
    """Seconds the server asked for: an exhausted 429's RateLimit reset, or ``Retry-After``."""
    if response.status_code == 429:
        info = hf_utils.parse_ratelimit_headers(response.headers)
        if info is not None and info.remaining == 0:
            return float(info.reset_in_seconds)
    try:
        return max(0.0, float(response.headers.get("Retry-After", "")))
    except ValueError:
        return None  # absent, or an HTTP date (the Hub sends seconds)

"""Which failures of a Hub request are worth repeating: an exception in, the one to raise out.

``Classifier.classify`` reads the whole cause chain of what huggingface_hub, httpx2 or hf_xet
raised (the library wraps a failed LFS upload in a plain ``RuntimeError``, our session hooks
wrap network errors in ``NetworkFailure``) and returns ``Transient`` (the policy retries it) or a
one-line ``HubError``:

- timeouts, dropped connections, cut bodies, 5xx, 408, 429 (with the wait the server asked
  for) and garbled answers are transient; so is any failure of the upload steps before the
  commit request (preupload, LFS batch, the PUT to storage, verify): nothing can have landed;
- the storage origin's answers (S3 and its kin: an expired or refused signed URL, a body it
  did not take) are transient too: the next attempt asks the Hub for a fresh URL;
- the Hub's 401, 403, 400, a missing repo and a missing token are ``permanent``: retrying
  cannot help; 412 is ``CommitConflict``; 404 EntryNotFound is ``Missing``.

A commit whose request went out and whose answer was lost is ``ambiguous``: it may have landed.
Anything else is no Hub failure and is returned as it is, a bug to see rather than to retry.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
from huggingface_hub import errors as hf_errors
from huggingface_hub import utils as hf_utils

from speedtronic.hub.errors import CommitConflict, HubError, RepoNotFound, Transient
from speedtronic.hub.session import NETWORK, Attempt, NetworkFailure, origin
from speedtronic.hub.wording import Op, Wording

_NOT_SENT = (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)
# hf_xet raises builtins (ConnectionError after its own retries); a socket's own errors
_BUILTIN_NETWORK = (ConnectionError, TimeoutError)
_GARBLED = (ValueError, KeyError, TypeError, httpx2.DecodingError)
TOKEN_HINT = "set HF_TOKEN to a valid token, or run: hf auth login"
WRITE_HINT = "use a token with write access to the repo (see: speedtronic hub grant)"


class Missing(HubError):
    """404 EntryNotFound: no such path at that revision (callers answer None or [])."""


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what caused it (``__cause__``, else ``__context__``), each once."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


class Classifier:
    """Failures of one repo's requests, worded by ``wording``; ``api_origin`` tells the Hub's
    own answers from its storage's."""

    def __init__(self, repo_id: str, wording: Wording, api_origin: tuple):
        self.repo_id, self.wording, self.api_origin = repo_id, wording, api_origin

    def classify(self, exc: Exception, op: Op, attempt: Attempt | None = None) -> Exception:
        """The exception to raise for ``exc``: ``Transient`` (retry), a ``HubError``, or
        ``exc`` itself when it is no Hub failure."""
        if isinstance(exc, (Transient, HubError)):
            return exc
        sent = attempt is not None and attempt.commit_sent  # else nothing can have landed
        for link in causes(exc):
            found = self._known(link, op, sent)
            if found is not None:
                return found
        if not sent and op.write and isinstance(exc, RuntimeError):
            # the library's wrapper of a failed upload step, whatever its cause
            return Transient(None, self.wording.detail(f"upload failed: {_line(exc)}"))
        return exc  # not a Hub failure: a bug to see, not to retry

    def _known(self, exc: BaseException, op: Op, sent: bool) -> Exception | None:
        """What ``exc`` (one link of the chain) says, or None when it says nothing we know."""
        detail = self.wording.detail(_line(exc))
        if isinstance(exc, hf_errors.HfHubHTTPError) and exc.response is not None:
            return self._http(exc, op, sent)
        if isinstance(exc, NETWORK):
            lost = sent and not isinstance(exc, _NOT_SENT)
            return Transient(None, detail, ambiguous=op.write and lost)
        if isinstance(exc, NetworkFailure):
            return None  # its cause says more
        if isinstance(exc, RuntimeError) and "client has been closed" in str(exc):
            # a session closed under this request (the library does after connection errors,
            # and at exit): it was never sent
            return Transient(None, detail)
        if isinstance(exc, hf_errors.LocalTokenNotFoundError):
            message = self.wording.message(op, None, "no token found")
            return HubError(message, hint=TOKEN_HINT, permanent=True)
        if isinstance(exc, (hf_errors.OfflineModeIsEnabled, hf_errors.HFValidationError)):
            message = self.wording.message(op, None, self.wording.detail(str(exc)))
            return HubError(message, permanent=True)
        if isinstance(exc, _BUILTIN_NETWORK):
            return Transient(None, detail, ambiguous=op.write and sent)
        if isinstance(exc, _GARBLED):
            # a garbled answer (a proxy's HTML page, a cut body): retried; a commit may have landed
            garbled = self.wording.detail(f"unreadable answer: {_line(exc)}")
            return Transient(None, garbled, ambiguous=op.write and sent)
        return None

    def _http(self, exc: hf_errors.HfHubHTTPError, op: Op, sent: bool) -> Exception:
        response = exc.response
        status, code = response.status_code, response.headers.get("X-Error-Code")
        detail = self.wording.detail(exc.server_message or str(exc))
        message = self.wording.message
        if status in (408, 429) or status >= 500:
            return Transient(status, detail, server_wait(response), op.write and sent)
        if not self._from_hub(response):  # a signed URL refused or expired: ask for a new one
            return Transient(status, f"storage: {detail}")
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

    def _from_hub(self, response: httpx2.Response) -> bool:
        try:
            return origin(response.request.url) == self.api_origin
        except RuntimeError:  # a response built without a request: treat it as the Hub's
            return True


def _line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


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

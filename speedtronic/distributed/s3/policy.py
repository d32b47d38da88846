"""The failure policy of every S3 request: which answers are retried, how long to wait, how a
failure is worded.

``RequestPolicy.run`` calls one request function under the policy. botocore's own retries are
off (see ``client``), so each call is one attempt, counted by the client and bounded by its
timeouts, and all of a request's attempts and waits by its ``deadline_s``; here, timeouts,
dropped connections, 5xx, 503 SlowDown and 429 are retried with exponential back-off and full
jitter (or after the ``Retry-After`` the store asks for), while
403, a missing bucket, missing credentials and the other 4xx fail at once as a permanent
``S3Error`` in one line naming the object and the store's code. A write whose answer was lost
(a dropped connection after sending, a 500) is ``ambiguous``: the caller learns that it may
have landed. Every message has the credentials in use scrubbed out of it.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import tenacity
from botocore import exceptions as bx

from speedtronic.distributed.s3.errors import PreconditionFailed, S3Error, Unsupported

T = TypeVar("T")
log = logging.getLogger("speedtronic.s3")
_NOT_SENT = (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ProxyConnectionError)
_NETWORK = (bx.HTTPClientError, bx.ResponseStreamingError, bx.IncompleteReadError)
_NO_CREDENTIALS = (
    bx.NoCredentialsError,
    bx.PartialCredentialsError,
    bx.ProfileNotFound,
    bx.TokenRetrievalError,
    bx.SSOError,
    bx.CredentialRetrievalError,
)
_CREDENTIALS_HINT = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE); see docs/storage.md"
)
# Answers that mean "later": throttling and the store's own trouble (S3's codes)
_TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable"}
_TRANSIENT_CODES |= {"Throttling", "ThrottlingException"}
_NOT_APPLIED = {429, 503}  # refused before doing anything: a write with this answer did not land


class Transient(Exception):
    """Inside the client only: worth another attempt. ``ambiguous``: a write that may have
    landed, its answer lost; ``wait_s``: what the store asked for (Retry-After)."""

    def __init__(self, status, detail: str, ambiguous: bool = False, wait_s=None):
        super().__init__(detail)
        self.status, self.detail, self.ambiguous, self.wait_s = status, detail, ambiguous, wait_s


class RequestPolicy:
    """Retries, waits and wording for one client; ``session`` names the credentials to hide."""

    def __init__(
        self,
        *,
        counter: Any,
        node_id: str,
        where: str,
        session: Any,
        max_attempts: int,
        max_backoff_s: float,
        sleep: Callable[[float], None],
        deadline_s: float = float("inf"),
    ):
        self.counter, self.node_id, self.where, self._session = counter, node_id, where, session
        self.max_attempts, self.max_backoff_s = max(1, max_attempts), max_backoff_s
        self.deadline_s = deadline_s  # attempts and waits of one request, all together
        self._sleep = sleep
        self._backoff = tenacity.wait_random_exponential(multiplier=0.25, max=max_backoff_s)
        self._secret_cache: set[str] | None = None
        self._secret_lock = threading.Lock()  # a boto3 session is not thread-safe

    def run(self, what: str, subject: str, fn: Callable[[], T], write: bool = False) -> T:
        """``fn()`` under the policy: transient failures retried, the rest raised at once."""
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.max_attempts)
            | tenacity.stop_after_delay(self.deadline_s),
            wait=self._wait,
            retry=tenacity.retry_if_exception_type(Transient),
            sleep=self._sleep,
            before_sleep=lambda state: self._log_retry(what, subject, state),
            reraise=True,
        )

        def attempt() -> T:
            try:
                return fn()
            except (Transient, S3Error):
                raise
            except Exception as exc:
                raise self.classify(exc, what, subject, write) from exc

        try:
            return retrying(attempt)
        except Transient as exc:
            message = self.message(what, subject, exc.status, exc.detail)
            attempts = retrying.statistics.get("attempt_number", self.max_attempts)
            message += f" (gave up after {attempts} attempts)"
            raise S3Error(message, status=exc.status, maybe_landed=exc.ambiguous) from None

    def classify(self, exc: Exception, what: str, subject: str, write: bool) -> Exception:
        """The exception to raise for ``exc``: ``Transient`` (retry) or an ``S3Error``."""
        if isinstance(exc, (Transient, S3Error)):
            return exc
        if isinstance(exc, bx.ClientError):
            return self._classify_answer(exc, what, subject, write)
        if isinstance(exc, _NO_CREDENTIALS):
            detail = f"no usable credentials ({self.detail(str(exc))}): {_CREDENTIALS_HINT}"
            return S3Error(self.message(what, subject, None, detail), permanent=True)
        if isinstance(exc, _NOT_SENT):
            return Transient(None, self.detail(f"{type(exc).__name__}: {exc}"))
        if isinstance(exc, _NETWORK):  # sent, and then the answer was lost or cut
            return Transient(None, self.detail(f"{type(exc).__name__}: {exc}"), ambiguous=write)
        if isinstance(exc, (bx.ParamValidationError, bx.NoRegionError, ValueError)):
            detail = self.detail(str(exc))
            return S3Error(self.message(what, subject, None, detail), permanent=True)
        return exc  # not a store failure: a bug to see, not to retry

    def _classify_answer(self, exc: bx.ClientError, what: str, subject: str, write: bool):
        status, code = status_of(exc), code_of(exc)
        detail = self.detail(f"{code}: {exc.response.get('Error', {}).get('Message') or code}")
        if status in (408, 429) or (status or 0) >= 500 and status != 501:
            ambiguous = write and status not in _NOT_APPLIED
            return Transient(status, detail, ambiguous, _retry_after(exc))
        if code in _TRANSIENT_CODES:
            # a 4xx-coded store error; only an internal error may have applied the write
            return Transient(status, detail, ambiguous=write and code == "InternalError")
        message = self.message(what, subject, status, detail)
        if status == 412 or code in ("PreconditionFailed", "ConditionalRequestConflict"):
            return PreconditionFailed(message, status=status)
        if status == 501:
            return Unsupported(message, status=501, code=code)
        permanent = status in (400, 401, 403)
        if code == "NoSuchBucket" or (status == 404 and code in ("404", "NotFound", None)):
            detail = f"{detail}: no such bucket at {self.where}"
            message = self.message(what, subject, status, detail)
            permanent = True  # (a HEAD's 404 has no code; bucket_exists() turns it into False)
        elif status in (401, 403):
            message += f": the credentials may not do this (docs/storage.md, at {self.where})"
        elif code in ("PermanentRedirect", "AuthorizationHeaderMalformed"):
            message += ": the bucket is in another region: set AWS_REGION to its region"
            permanent = True
        return S3Error(message, status=status, code=code, permanent=permanent)

    def _wait(self, state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception()
        self.counter.add("retries")
        if isinstance(exc, Transient) and exc.wait_s is not None:
            wait = min(exc.wait_s, self.max_backoff_s) + random.uniform(0.0, 0.5)
        else:
            wait = self._backoff(state)
        left = self.deadline_s - (state.seconds_since_start or 0.0)
        return max(0.0, min(wait, left))  # never sleeps past the request's deadline

    def _log_retry(self, what: str, subject: str, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception()
        message, n = self.message(what, subject, exc.status, exc.detail), state.attempt_number
        log.info("%s (attempt %d of %d); retrying", message, n, self.max_attempts)

    # -- wording ------------------------------------------------------------------------------

    def message(self, what: str, subject: str, status, detail: str) -> str:
        prefix = f"{self.node_id}: " if self.node_id else ""
        code = status if status is not None else "no answer"
        return self.scrub(f"{prefix}{what} {subject} ({code}): {detail}")

    def detail(self, text: str) -> str:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "no message")
        first = self.scrub(first)  # before cutting: a secret across the cut would survive it
        return first if len(first) <= 200 else first[:197] + "..."

    def scrub(self, text: str) -> str:
        for secret in self._secrets():
            text = text.replace(secret, "<secret>")
        return text

    def _secrets(self) -> set[str]:
        """The credentials in use (and in the environment), to be kept out of every message.

        Looked up once: without credentials the chain may ask an instance metadata service."""
        with self._secret_lock:
            if self._secret_cache is None:
                self._secret_cache = self._find_secrets()
            return self._secret_cache

    def _find_secrets(self) -> set[str]:
        names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
        found = {os.environ.get(name, "") for name in names}
        try:
            credentials = self._session.get_credentials()
            frozen = credentials.get_frozen_credentials() if credentials else None
        except Exception:  # no credentials at all is reported elsewhere
            frozen = None
        if frozen is not None:
            found |= {frozen.access_key or "", frozen.secret_key or "", frozen.token or ""}
        return {s for s in found if len(s) >= 8}


def status_of(exc: bx.ClientError) -> int | None:
    return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def code_of(exc: bx.ClientError) -> str | None:
    return exc.response.get("Error", {}).get("Code")


def _retry_after(exc: bx.ClientError) -> float | None:
    headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders") or {}
    try:
        return max(0.0, float(headers.get("retry-after", "")))
    except ValueError:
        return None

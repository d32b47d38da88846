"""One bucket and prefix over the S3 API, as DumbDiLoCo needs it; the only ``boto3`` importer.

``S3Client`` owns the requests and their failure policy, in one place (``_run``): botocore's
own retries are off (one attempt per call) so that every attempt is counted, bounded by the
client's timeouts, and classified here: timeouts, dropped connections, 5xx, 503 SlowDown and
429 are retried with exponential back-off and full jitter; 403, a missing bucket, missing
credentials and other 4xx fail at once in one line naming the object and the store's code;
404 NoSuchKey is "absent", 304 "unchanged", 412 ``PreconditionFailed``. A write whose answer
was lost is sent again as it was (an unconditional PUT of the same bytes is idempotent); a
conditional one that then meets a 412 says so (``after_lost``) for the caller to look. Paths
are repo paths (``nodes/a/delta_1.safetensors``), the prefix is added and removed here.
Credentials come from boto3's standard chain (environment, profiles, SSO, instance roles) and
never appear in a message: they are scrubbed from every error text.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import boto3
import tenacity
from botocore import exceptions as bx
from botocore.config import Config

from speedtronic.config.storage import endpoint_url_problem
from speedtronic.distributed.s3.counter import RequestCounter
from speedtronic.distributed.s3.errors import PreconditionFailed, S3Error, Unsupported
from speedtronic.errors import ConfigError

T = TypeVar("T")
log = logging.getLogger("speedtronic.s3")
ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")  # botocore's own names, in order
NOT_MODIFIED = object()  # get(): the object still has the version named by if_none_match
MAX_PUT_BYTES = 5 * 1024**3  # S3's limit for one PUT; bigger objects need multipart uploads
MIN_DOWNLOAD_RATE = 1 << 20  # bytes/s: a body slower than this (after timeout_s) is retried
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
# Answers that mean "later": throttling and the store's own trouble (S3's codes and statuses)
_TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable"}
_TRANSIENT_CODES |= {"Throttling", "ThrottlingException"}
_NOT_APPLIED = {429, 503}  # refused before doing anything: a write with this answer did not land


@dataclass(frozen=True)
class Listed:
    """An object under a listed prefix: its repo path, size and ETag (changes with its bytes)."""

    path: str
    size: int
    etag: str


@dataclass(frozen=True)
class Got:
    """A downloaded object: its bytes and ETag."""

    data: bytes
    etag: str


class Transient(Exception):
    """Inside the client only: worth another attempt. ``ambiguous``: a write that may have
    landed, its answer lost; ``wait_s``: what the store asked for (Retry-After)."""

    def __init__(self, status, detail: str, ambiguous: bool = False, wait_s=None):
        super().__init__(detail)
        self.status, self.detail, self.ambiguous, self.wait_s = status, detail, ambiguous, wait_s


def resolve_endpoint(endpoint_url: str | None) -> str | None:
    """``endpoint_url``, else ``$AWS_ENDPOINT_URL_S3`` / ``$AWS_ENDPOINT_URL``; checked."""
    source, url = "distributed.endpoint_url", endpoint_url
    for name in ENDPOINT_ENVS:
        if url is None and os.environ.get(name, "").strip():
            source, url = f"${name}", os.environ[name].strip()
    problem = None if url is None else endpoint_url_problem(url)
    if problem is not None:
        raise ConfigError(f"{source}: {problem}")
    return url


class S3Client:
    """One ``bucket`` and ``prefix``, for one node. Thread-safe: a node's threads share one."""

    LIST_PAGE = 1000  # objects per ListObjectsV2 request (S3's maximum)

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        node_id: str = "",
        timeout_s: float = 60.0,
        max_attempts: int = 8,
        max_backoff_s: float = 20.0,
        sleep: Callable[[float], None] = time.sleep,
        counter: RequestCounter | None = None,
        session: Any = None,
    ):
        self.bucket, self.prefix, self.node_id = bucket, prefix.strip("/"), node_id
        self.endpoint_url = resolve_endpoint(endpoint_url)
        self.counter = counter if counter is not None else RequestCounter()
        self.timeout_s, self.max_attempts = timeout_s, max(1, max_attempts)
        self.max_backoff_s, self._sleep = max_backoff_s, sleep
        self._session = session if session is not None else boto3.session.Session()
        self._s3 = self._session.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self._session.region_name or "us-east-1",  # gateways need one
            config=self._config(),
        )
        self._s3.meta.events.register("before-send.s3", self._on_send)
        self._backoff = tenacity.wait_random_exponential(multiplier=0.25, max=max_backoff_s)
        self._secret_cache: set[str] | None = None

    def _config(self) -> Config:
        return Config(
            connect_timeout=min(self.timeout_s, 10.0),
            read_timeout=self.timeout_s,
            retries={"total_max_attempts": 1, "mode": "standard"},  # ours: see _run
            # a store behind a custom endpoint (MinIO, R2, the Hugging Face gateway) is
            # addressed by path; AWS itself picks virtual hosts
            s3={"addressing_style": "path" if self.endpoint_url else "auto"},
            # newer botocore sends CRC trailers that some gateways refuse; every file is
            # validated by the codec anyway (docs/storage.md)
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            max_pool_connections=16,
            user_agent_extra="speedtronic",
        )

    def __repr__(self) -> str:  # never the credentials
        return f"S3Client({self.url()!r}, endpoint_url={self.endpoint_url!r})"

    def url(self, path: str = "") -> str:
        """``s3://bucket/prefix/path``, as messages and ``describe`` show it."""
        return "s3://" + "/".join(p for p in (self.bucket, self.prefix, path) if p)

    def key(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix else path

    def _on_send(self, request: Any = None, event_name: str = "", **_: Any) -> None:
        self.counter.request(event_name.rsplit(".", 1)[-1])

    # -- the bucket ---------------------------------------------------------------------------

    def bucket_exists(self) -> bool:
        """HeadBucket: True, or False when it is missing; 403 and the rest raise."""
        try:
            self._run("cannot reach", self.url(), lambda: self._s3.head_bucket(Bucket=self.bucket))
        except S3Error as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def create_bucket(self) -> None:
        def create() -> None:
            try:
                self._s3.create_bucket(Bucket=self.bucket, **self._location())
            except bx.ClientError as exc:
                if _code(exc) not in ("BucketAlreadyOwnedByYou",):  # a retry after a lost answer
                    raise

        self._run("cannot create the bucket", self.url(), create, write=True)

    def _location(self) -> dict:
        region = self._s3.meta.region_name
        if self.endpoint_url or region in (None, "us-east-1"):
            return {}
        return {"CreateBucketConfiguration": {"LocationConstraint": region}}

    # -- objects ------------------------------------------------------------------------------

    def put(
        self, path: str, data: bytes, *, if_match: str | None = None, if_none_match=None
    ) -> str:
        """PUT ``data`` at ``path``; its new ETag. ``if_match`` (an ETag) or ``if_none_match``
        ("*": only if absent) make it conditional: ``PreconditionFailed`` when not met."""
        if len(data) > MAX_PUT_BYTES:  # one PUT's limit: refused before sending
            message = self._msg("cannot write", self.url(path), None, "over S3's 5 GiB per PUT")
            raise S3Error(message, permanent=True)
        kwargs = {"Bucket": self.bucket, "Key": self.key(path), "Body": data}
        kwargs.update({"IfMatch": if_match} if if_match else {})
        kwargs.update({"IfNoneMatch": if_none_match} if if_none_match else {})
        lost = [False]

        def attempt() -> str:
            try:
                etag = self._s3.put_object(**kwargs)["ETag"]
            except Exception as exc:
                err = self._classify(exc, "cannot write", self.url(path), write=True)
                lost[0] = lost[0] or (isinstance(err, Transient) and err.ambiguous)
                if isinstance(err, PreconditionFailed):
                    err.after_lost = lost[0]
                raise err from exc
            self.counter.add("bytes_up", len(data))
            return etag

        try:
            return self._run("cannot write", self.url(path), attempt, write=True)
        except S3Error as exc:
            if lost[0] and not isinstance(exc, PreconditionFailed):
                exc.maybe_landed = True  # unknown: the caller sends these same bytes again
            raise

    def get(self, path: str, max_bytes: int, *, if_match=None, if_none_match=None) -> Any:
        """``Got`` for ``path``; None if absent; ``NOT_MODIFIED`` if it still has the ETag
        ``if_none_match``; ``PreconditionFailed`` if it no longer has ``if_match``. An object
        over ``max_bytes`` is refused from its Content-Length, before its body is read."""
        kwargs = {"Bucket": self.bucket, "Key": self.key(path)}
        kwargs.update({"IfMatch": if_match} if if_match else {})
        kwargs.update({"IfNoneMatch": if_none_match} if if_none_match else {})

        def attempt() -> Any:
            started = time.monotonic()
            try:
                answer = self._s3.get_object(**kwargs)
            except bx.ClientError as exc:
                if _status(exc) == 304:
                    return NOT_MODIFIED
                if _code(exc) == "NoSuchKey":
                    return None
                raise
            return Got(self._body(path, answer, max_bytes, started), answer["ETag"])

        return self._run("cannot read", self.url(path), attempt)

    def _body(self, path: str, answer: dict, max_bytes: int, started: float) -> bytes:
        body, size = answer["Body"], int(answer.get("ContentLength") or 0)
        if size > max_bytes:  # a bad file, not a bad node: refused unread
            body.close()
            detail = f"{size} bytes, over the {max_bytes} byte cap; not downloaded"
            raise S3Error(self._msg("refusing", self.url(path), 413, detail), status=413)
        deadline = started + self.timeout_s + size / MIN_DOWNLOAD_RATE
        data = bytearray()
        try:
            for chunk in body.iter_chunks(1 << 20):
                data += chunk
                if time.monotonic() > deadline or len(data) > max_bytes:
                    break
        finally:
            body.close()
        if len(data) != size:  # cut short, or slower than the deadline allows
            raise Transient(None, f"got {len(data)} of {size} bytes of {path} in time")
        self.counter.add("bytes_down", size)
        return bytes(data)

    def list(self, folder: str) -> list[Listed]:
        """Every object under ``folder`` (a repo path), one request per 1,000."""
        folder = folder.strip("/")
        prefix = self.key(folder + "/") if folder else self.key("")
        out, token = [], None
        while True:
            page = self._run(
                "cannot list", self.url(folder), lambda t=token: self._list_page(prefix, t)
            )
            cut = len(self.key(""))
            for item in page.get("Contents") or []:
                out.append(Listed(item["Key"][cut:], int(item["Size"]), item["ETag"]))
            token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
            if token is None:
                return out

    def _list_page(self, prefix: str, token: str | None) -> dict:
        more = {"ContinuationToken": token} if token else {}
        return self._s3.list_objects_v2(
            Bucket=self.bucket, Prefix=prefix, MaxKeys=self.LIST_PAGE, **more
        )

    def delete(self, paths: list[str]) -> list[str]:
        """Delete ``paths`` (absent ones are fine), 1,000 per request; those that failed."""
        failed: list[str] = []
        unique = list(dict.fromkeys(paths))
        for start in range(0, len(unique), 1000):
            batch = unique[start : start + 1000]
            objects = {"Objects": [{"Key": self.key(p)} for p in batch], "Quiet": True}
            answer = self._run(
                "cannot delete from",
                self.url(),
                lambda o=objects: self._s3.delete_objects(Bucket=self.bucket, Delete=o),
                write=True,
            )
            cut = len(self.key(""))
            failed += [e["Key"][cut:] for e in answer.get("Errors") or [] if "Key" in e]
        return failed

    # -- the failure policy -------------------------------------------------------------------

    def _run(self, what: str, subject: str, fn: Callable[[], T], write: bool = False) -> T:
        """``fn()`` under the policy: transient failures retried, the rest raised at once."""
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.max_attempts),
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
                raise self._classify(exc, what, subject, write) from exc

        try:
            return retrying(attempt)
        except Transient as exc:
            message = self._msg(what, subject, exc.status, exc.detail)
            message += f" (gave up after {self.max_attempts} attempts)"
            raise S3Error(message, status=exc.status, maybe_landed=exc.ambiguous) from None

    def _classify(self, exc: Exception, what: str, subject: str, write: bool) -> Exception:
        """The exception to raise for ``exc``: ``Transient`` (retry) or an ``S3Error``."""
        if isinstance(exc, (Transient, S3Error)):
            return exc
        if isinstance(exc, bx.ClientError):
            return self._classify_answer(exc, what, subject, write)
        if isinstance(exc, _NO_CREDENTIALS):
            detail = f"no usable credentials ({self._detail(str(exc))}): {_CREDENTIALS_HINT}"
            return S3Error(self._msg(what, subject, None, detail), permanent=True)
        if isinstance(exc, _NOT_SENT):
            return Transient(None, self._detail(f"{type(exc).__name__}: {exc}"))
        if isinstance(exc, _NETWORK):  # sent, and then the answer was lost or cut
            return Transient(None, self._detail(f"{type(exc).__name__}: {exc}"), ambiguous=write)
        if isinstance(exc, (bx.ParamValidationError, bx.NoRegionError, ValueError)):
            return S3Error(self._msg(what, subject, None, self._detail(str(exc))), permanent=True)
        return exc  # not a store failure: a bug to see, not to retry

    def _classify_answer(self, exc: bx.ClientError, what: str, subject: str, write: bool):
        status, code = _status(exc), _code(exc)
        detail = self._detail(f"{code}: {exc.response.get('Error', {}).get('Message') or code}")
        if status in (408, 429) or (status or 0) >= 500 and status != 501:
            ambiguous = write and status not in _NOT_APPLIED
            return Transient(status, detail, ambiguous, _retry_after(exc))
        if code in _TRANSIENT_CODES:
            # a 4xx-coded store error; only an internal error may have applied the write
            return Transient(status, detail, ambiguous=write and code == "InternalError")
        if status == 412 or code in ("PreconditionFailed", "ConditionalRequestConflict"):
            return PreconditionFailed(self._msg(what, subject, status, detail), status=status)
        if status == 501:
            return Unsupported(self._msg(what, subject, status, detail), status=501, code=code)
        message, permanent = self._msg(what, subject, status, detail), status in (400, 401, 403)
        if code == "NoSuchBucket" or (status == 404 and code in ("404", "NotFound", None)):
            message = self._msg(what, subject, status, f"{detail}: no such bucket at {self._at()}")
            permanent = True  # (a HEAD's 404 has no code; bucket_exists() turns it into False)
        elif status in (401, 403):
            message += f": the credentials may not do this (docs/storage.md, at {self._at()})"
        elif code in ("PermanentRedirect", "AuthorizationHeaderMalformed"):
            message += ": the bucket is in another region: set AWS_REGION to its region"
            permanent = True
        return S3Error(message, status=status, code=code, permanent=permanent)

    def _wait(self, state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception()
        self.counter.add("retries")
        if isinstance(exc, Transient) and exc.wait_s is not None:
            return min(exc.wait_s, self.max_backoff_s) + random.uniform(0.0, 0.5)
        return self._backoff(state)

    def _log_retry(self, what: str, subject: str, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception()
        message, n = self._msg(what, subject, exc.status, exc.detail), state.attempt_number
        log.info("%s (attempt %d of %d); retrying", message, n, self.max_attempts)

    def _at(self) -> str:
        return self.endpoint_url or "AWS S3"

    def _msg(self, what: str, subject: str, status, detail: str) -> str:
        prefix = f"{self.node_id}: " if self.node_id else ""
        code = status if status is not None else "no answer"
        return self._scrub(f"{prefix}{what} {subject} ({code}): {detail}")

    def _detail(self, text: str) -> str:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "no message")
        first = self._scrub(first)  # before cutting: a secret across the cut would survive it
        return first if len(first) <= 200 else first[:197] + "..."

    def _scrub(self, text: str) -> str:
        for secret in self._secrets():
            text = text.replace(secret, "<secret>")
        return text

    def _secrets(self) -> set[str]:
        """The credentials in use (and in the environment), to be kept out of every message.

        Looked up once: without credentials the chain may ask an instance metadata service."""
        if self._secret_cache is not None:
            return self._secret_cache
        found = {os.environ.get(n, "") for n in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")}
        found.add(os.environ.get("AWS_ACCESS_KEY_ID", ""))
        try:
            credentials = self._session.get_credentials()
            frozen = credentials.get_frozen_credentials() if credentials else None
        except Exception:  # no credentials at all is reported elsewhere
            frozen = None
        if frozen is not None:
            found |= {frozen.access_key or "", frozen.secret_key or "", frozen.token or ""}
        self._secret_cache = {s for s in found if len(s) >= 8}
        return self._secret_cache


def _status(exc: bx.ClientError) -> int | None:
    return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def _code(exc: bx.ClientError) -> str | None:
    return exc.response.get("Error", {}).get("Code")


def _retry_after(exc: bx.ClientError) -> float | None:
    headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders") or {}
    try:
        return max(0.0, float(headers.get("retry-after", "")))
    except ValueError:
        return None

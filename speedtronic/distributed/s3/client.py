"""One bucket and prefix over the S3 API, as DumbDiLoCo needs it; the only ``boto3`` importer.

``S3Client`` owns the requests: each operation is one botocore call per attempt (botocore's own
retries are off) under ``policy.RequestPolicy``, which retries what is transient and words what
is not, within a total deadline per request; every attempt is counted per operation by a
botocore event hook and bounded by the client's timeouts (connect, read, and a deadline on each
body read). A store that answers nothing is remembered (``silence.Silence``): requests then fail
at once until a probe hears it again, and until it has answered once, the start-up check's
HEAD waits seconds, not a read timeout. 404 NoSuchKey is "absent",
304 "unchanged", 412 ``PreconditionFailed``. A write whose answer was lost is sent again as it
was (an unconditional PUT of the same bytes is idempotent); a conditional one that then meets a
412 says so (``after_lost``) for the caller to look. Paths are repo paths
(``nodes/a/delta_1.safetensors``): the prefix is added and removed here. Credentials come from
boto3's standard chain (environment, profiles, SSO, instance roles), never from the config.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
from botocore import exceptions as bx
from botocore.config import Config

from speedtronic.config.storage import endpoint_url_problem
from speedtronic.distributed.s3.counter import RequestCounter
from speedtronic.distributed.s3.errors import NOT_MODIFIED, PreconditionFailed, S3Error
from speedtronic.distributed.s3.policy import RequestPolicy, Transient, code_of, status_of
from speedtronic.distributed.s3.silence import Silence
from speedtronic.errors import ConfigError

ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")  # botocore's own names, in order
MAX_PUT_BYTES = 5 * 1024**3  # S3's limit for one PUT; bigger objects need multipart uploads
MIN_DOWNLOAD_RATE = 1 << 20  # bytes/s: a body slower than this (after timeout_s) is retried
FIRST_ANSWER_S = 5.0  # a store never heard from answers a HEAD within this, or is silent


@dataclass(frozen=True)
class Listed:
    """An object under a listed prefix: its repo path, size and ETag (changes with its bytes)."""

    path: str
    size: int
    etag: str


@dataclass(frozen=True)
class Got:
    """A downloaded object: its bytes and ETag (None if the store sent none)."""

    data: bytes
    etag: str | None


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


def botocore_config(read_timeout_s: float, endpoint_url: str | None) -> Config:
    """One botocore client's settings: our timeouts and retries (none of botocore's)."""
    return Config(
        connect_timeout=min(read_timeout_s, 10.0),
        read_timeout=read_timeout_s,
        retries={"total_max_attempts": 1, "mode": "standard"},  # ours: see _run
        # a store behind a custom endpoint (MinIO, R2, the Hugging Face gateway) is
        # addressed by path; AWS itself picks virtual hosts
        s3={"addressing_style": "path" if endpoint_url else "auto"},
        # newer botocore sends CRC trailers that some gateways refuse; every file is
        # validated by the codec anyway (docs/storage.md)
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        max_pool_connections=16,
        user_agent_extra="speedtronic",
    )


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
        self.timeout_s = timeout_s
        self._session = session if session is not None else boto3.session.Session()
        self.policy = RequestPolicy(
            counter=self.counter,
            node_id=node_id,
            where=self.endpoint_url or "AWS S3",
            session=self._session,
            max_attempts=max_attempts,
            max_backoff_s=max_backoff_s,
            sleep=sleep,
            deadline_s=2 * timeout_s,  # every request's attempts and waits together
        )
        self._clients: dict[float, Any] = {}  # botocore clients by read timeout
        self._clients_lock = threading.Lock()
        self._s3 = self._client(timeout_s)
        first = min(FIRST_ANSWER_S, timeout_s)
        self.silence = Silence(self._probe, first_s=first, longest_s=timeout_s)

    def _client(self, read_timeout_s: float) -> Any:
        """The botocore client whose read timeout is ``read_timeout_s`` (probes wait less)."""
        with self._clients_lock:
            if read_timeout_s not in self._clients:
                client = self._session.client(
                    "s3",
                    endpoint_url=self.endpoint_url,
                    region_name=self._session.region_name or "us-east-1",  # gateways need one
                    config=botocore_config(read_timeout_s, self.endpoint_url),
                )
                client.meta.events.register("before-send.s3", self._on_send)
                client.meta.events.register("after-call.s3", self._on_answer)
                self._clients[read_timeout_s] = client
            return self._clients[read_timeout_s]

    @property
    def max_attempts(self) -> int:
        return self.policy.max_attempts

    def __repr__(self) -> str:  # never the credentials
        return f"S3Client({self.url()!r}, endpoint_url={self.endpoint_url!r})"

    def url(self, path: str = "") -> str:
        """``s3://bucket/prefix/path``, as messages and ``describe`` show it."""
        return "s3://" + "/".join(p for p in (self.bucket, self.prefix, path) if p)

    def key(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix else path

    def _on_send(self, request: Any = None, event_name: str = "", **_: Any) -> None:
        self.counter.request(event_name.rsplit(".", 1)[-1])

    def _on_answer(self, **_: Any) -> None:
        self.silence.heard()  # an HTTP answer, an error too: the store is there

    def _run(self, what: str, subject: str, fn: Callable[[], Any], write: bool = False) -> Any:
        """``fn`` under the request policy, each attempt through the silence gate."""

        def attempt() -> Any:
            why = self.silence.admit()
            if why is not None:  # transient: the caller tries again later
                raise S3Error(self.policy.message(what, subject, None, why))
            try:
                return fn()
            except Exception as exc:
                self.silence.failed(exc)
                raise

        return self.policy.run(what, subject, attempt, write)

    def _probe(self, timeout_s: float) -> bool:
        """One HEAD of the bucket waiting at most ``timeout_s``: whether the store answered."""
        try:
            self._client(timeout_s).head_bucket(Bucket=self.bucket)
        except bx.ClientError:
            return True  # an answer (403, 404...): what it means is the request's to find out
        except Exception:  # no answer, a refused connection, a dropped one: still silent
            return False
        return True

    # -- the bucket ---------------------------------------------------------------------------

    def bucket_exists(self) -> bool:
        """HeadBucket: True, or False when it is missing; 403 and the rest raise."""
        # never heard from (the start-up check): a few seconds, not a read timeout, per attempt
        s3 = self._s3 if self.silence.heard_once else self._client(self.silence.first_s)
        try:
            self._run("cannot reach", self.url(), lambda: s3.head_bucket(Bucket=self.bucket))
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
                if code_of(exc) != "BucketAlreadyOwnedByYou":  # a retry after a lost answer
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
    ) -> str | None:
        """PUT ``data`` at ``path``; its new ETag. ``if_match`` (an ETag) or ``if_none_match``
        ("*": only if absent) make it conditional: ``PreconditionFailed`` when not met."""
        if len(data) > MAX_PUT_BYTES:  # one PUT's limit: refused before sending
            message = self.policy.message("cannot write", self.url(path), None, "over 5 GiB")
            raise S3Error(message, permanent=True)
        kwargs = {"Bucket": self.bucket, "Key": self.key(path), "Body": data}
        kwargs.update({"IfMatch": if_match} if if_match else {})
        kwargs.update({"IfNoneMatch": if_none_match} if if_none_match else {})
        lost = [False]

        def attempt() -> str:
            try:
                # a gateway that sends no ETag only costs the next pointer write a re-read
                etag = self._s3.put_object(**kwargs).get("ETag")
            except Exception as exc:
                err = self.policy.classify(exc, "cannot write", self.url(path), write=True)
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
                if status_of(exc) == 304:
                    return NOT_MODIFIED
                if code_of(exc) == "NoSuchKey":
                    return None
                raise
            return Got(self._body(path, answer, max_bytes, started), answer.get("ETag"))

        return self._run("cannot read", self.url(path), attempt)

    def _body(self, path: str, answer: dict, max_bytes: int, started: float) -> bytes:
        body, size = answer["Body"], int(answer.get("ContentLength") or 0)
        if size > max_bytes:  # a bad file, not a bad node: refused unread
            body.close()
            detail = f"{size} bytes, over the {max_bytes} byte cap; not downloaded"
            raise S3Error(self.policy.message("refusing", self.url(path), 413, detail), status=413)
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
                size, etag = int(item.get("Size") or 0), item.get("ETag") or ""
                out.append(Listed(item["Key"][cut:], size, etag))
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

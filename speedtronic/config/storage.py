"""The rules of an object-storage repo spec: ``s3://bucket/prefix`` and the endpoint URL.

A DumbDiLoCo repo may live in an S3-compatible bucket (AWS S3, Hugging Face Storage Buckets
through their S3 gateway, Cloudflare R2, MinIO). This module owns what such a spec may look
like, so the config check (``distributed.repo_id``, ``distributed.endpoint_url``) and the
transport (``distributed.s3``) apply one rule. The rules are strict on purpose: the bucket and
prefix become object keys on every node and the endpoint is printed in logs, so anything odd
(``..``, a control character, credentials inside a URL) is refused with the reason. Stdlib only.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

S3_SCHEME = "s3://"
# S3's bucket rule (3-63 characters, starting and ending with a letter or digit), widened to
# upper case and '_' as the S3 API's own client check allows: gateways (a Hugging Face
# bucket's name) accept them, and AWS refuses them by itself when the bucket is created.
_BUCKET_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,61}[A-Za-z0-9]")
_BUCKET_RULE = (
    "3-63 letters, digits, '.', '-' or '_', starting and ending with a letter or digit, no '..'"
)
# One folder of the prefix: safe as a key segment on every store and in every log line
_SEGMENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_MAX_SEGMENTS = 16
# a DNS name or IPv4 address, or an IPv6 address (urlsplit drops its brackets)
_HOST_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|[0-9A-Fa-f:.]{2,45}")
_PATH_RE = re.compile(r"(/[A-Za-z0-9._~-]{1,128}){0,4}/?")


def is_s3_url(repo: object) -> bool:
    """Whether a repo spec names object storage (the scheme only; ``parse_s3_url`` checks)."""
    return isinstance(repo, str) and repo.startswith(S3_SCHEME)


def parse_s3_url(url: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``s3://bucket[/prefix]``; ValueError with the rule otherwise.

    The prefix has no leading or trailing '/' ('' for the bucket's root); each of its folders
    is 1-128 letters, digits, '.', '_' or '-' starting with a letter or digit.
    """
    if not is_s3_url(url):
        raise ValueError(f"must start with {S3_SCHEME}")
    bucket, _, prefix = url[len(S3_SCHEME) :].partition("/")
    if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
        raise ValueError(f"the bucket {bucket[:80]!r} is no bucket name ({_BUCKET_RULE})")
    prefix = prefix.rstrip("/")
    segments = prefix.split("/") if prefix else []
    bad = [s for s in segments if not _SEGMENT_RE.fullmatch(s)]
    if bad or len(segments) > _MAX_SEGMENTS:
        shown = bad[0][:80] if bad else prefix[:80]
        raise ValueError(
            f"the prefix folder {shown!r} is not allowed: at most {_MAX_SEGMENTS} folders of "
            "1-128 letters, digits, '.', '_' or '-', each starting with a letter or digit"
        )
    return bucket, prefix


def endpoint_url_problem(url: object) -> str | None:
    """Why ``url`` cannot be an S3 endpoint (``http(s)://host[:port][/path]``), or None.

    A path is allowed (the Hugging Face gateway is ``https://s3.hf.co/<namespace>``); a user
    or password inside the URL is refused, as it would be printed wherever the URL is.
    """
    if not isinstance(url, str) or len(url) > 512 or not url.isprintable():
        return "must be a printable URL of at most 512 characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"is no URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "must start with https:// (or http:// on a trusted network)"
    if "@" in parts.netloc:
        return "must not hold a user or password: credentials come from the environment"
    if not _HOST_RE.fullmatch(parts.hostname or "") or port == 0:
        return "must name a host (and optionally a port)"
    if parts.query or parts.fragment or not _PATH_RE.fullmatch(parts.path or ""):
        return "may have a short path (https://s3.hf.co/my-org), but no query or fragment"
    return None

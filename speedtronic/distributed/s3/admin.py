"""Setting up and checking a bucket for a run: what every node asks at start, and ``storage init``.

``check_access`` is the start-up check of every node: the bucket exists (a master creates a
missing one), these credentials can write under the prefix (a probe object, written and
deleted), and, for a master, whether the store honours conditional writes (a second
``If-None-Match: *`` PUT of the probe must be refused): without them the master falls back to
reading the pointer just before replacing it, and says so. A refusal (403, no bucket, no
credentials) is a permanent ``S3Error``: one line at start instead of after an inner loop.
``init_store`` is the same as a command (``speedtronic storage init``), with a report and the
config snippet to paste. Stdlib only: the requests are ``S3Client``'s.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from speedtronic.distributed.s3.errors import PreconditionFailed, S3Error, Unsupported

PROBE_DIR = "probes"  # outside nodes/ and global/: the master never lists it


@dataclass
class StoreReport:
    """What ``init_store`` found and did."""

    url: str
    endpoint: str
    existed: bool = False
    created: bool = False
    writable: bool = False
    conditional: bool | None = None  # None: not checked (dry run)
    notes: list[str] = field(default_factory=list)


def check_access(client: Any, role: str, logger: Any) -> bool:
    """The start-up check of one node; True when conditional writes work (always for a
    worker, which never makes one). Raises a permanent ``S3Error`` for what cannot work."""
    if not client.bucket_exists():
        if role != "master":
            raise _no_bucket(client)
        client.create_bucket()
        logger.notice(f"diloco master: created the bucket {client.url()}")
    probe = _probe_path(client)
    client.put(probe, _probe_body(client))
    conditional = True
    if role == "master":
        conditional = conditional_writes_work(client, probe)
        if not conditional:
            logger.warn(f"diloco master: {no_conditional_warning(client)}")
    try:
        client.delete([probe])
    except S3Error as exc:
        if role == "master" and exc.permanent:  # it deletes consumed deltas every round
            raise
    return conditional


def conditional_writes_work(client: Any, probe: str) -> bool:
    """Whether ``If-None-Match: *`` on an existing object is refused, as S3 does since 2024."""
    try:
        client.put(probe, _probe_body(client), if_none_match="*")
    except PreconditionFailed:
        return True
    except Unsupported:
        return False
    return False  # the header was ignored: the object was simply replaced


def no_conditional_warning(client: Any) -> str:
    return (
        f"{client.url()} ignores conditional writes (If-Match); the master reads the step "
        "count just before replacing it, so a second master is still detected, but two "
        "publishing within the same second could both land: run one master only"
    )


def init_store(client: Any, dry_run: bool = False) -> StoreReport:
    """``storage init``: create the bucket if missing, check writing and conditional writes."""
    report = StoreReport(client.url(), client.endpoint_url or "AWS S3 (region from the profile)")
    exists = report.existed = client.bucket_exists()
    if not exists and dry_run:
        report.notes.append(f"would create the bucket {client.bucket}")
        return report
    if not exists:
        client.create_bucket()
        report.created = True
    if dry_run:
        report.notes.append("dry run: nothing written; the write checks were skipped")
        return report
    probe = _probe_path(client)
    client.put(probe, _probe_body(client))
    report.writable = True
    report.conditional = conditional_writes_work(client, probe)
    failed = client.delete([probe])
    if failed:
        report.notes.append("these credentials cannot delete: a master needs them to")
    if not report.conditional:
        report.notes.append(no_conditional_warning(client))
    return report


def config_snippet(repo: str, endpoint_url: str | None) -> str:
    """The ``distributed:`` lines for a run in this bucket."""
    lines = [
        "distributed:",
        "  enabled: true",
        "  role: worker                # the master's node: --role master",
        f"  repo_id: {repo}",
    ]
    if endpoint_url:
        lines.append(f"  endpoint_url: {endpoint_url}")
    lines += [
        "  inner_steps: 500            # optimizer steps between syncs",
        "  poll_interval: 30           # seconds between checks of the bucket",
        "  min_publish_interval_s: 30  # every publish is the full weights, for every worker",
        "  delta_dtype: bf16",
    ]
    return "\n".join(lines)


def _no_bucket(client: Any) -> S3Error:
    who = f"{client.node_id}: " if client.node_id else ""
    where = client.endpoint_url or "AWS S3"
    return S3Error(
        f"{who}bucket {client.bucket} not found at {where} (or not visible to these "
        f"credentials): create it with speedtronic storage init {client.url()}",
        status=404,
        permanent=True,
    )


def _probe_path(client: Any) -> str:
    return f"{PROBE_DIR}/{client.node_id or 'speedtronic'}.json"


def _probe_body(client: Any) -> bytes:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return json.dumps({"node_id": client.node_id, "checked_at": stamp}).encode()

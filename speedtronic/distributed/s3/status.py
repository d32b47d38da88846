"""``storage status``: a bucket run at a glance, as ``hub status`` shows a Hub repo.

Three requests: ``step_count.json`` (the outer step, its age, the master's per-node summary)
and the listings of ``nodes/`` and ``global/`` (sizes). Bytes per round: the global each node
downloads (the object ``step_count.json`` names: full weights or an update), the keyframe an
update builds on (downloaded once), and each node's newest pending delta (its upload).
Stdlib only, over an ``S3Client``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from speedtronic.distributed.protocol import (
    GLOBAL_WEIGHTS,
    NODES_DIR,
    STEP_COUNT,
    parse_step_count,
)
from speedtronic.distributed.repo_status import run_summary
from speedtronic.distributed.transport import MAX_STEP_COUNT_BYTES
from speedtronic.errors import TransportError


@dataclass(frozen=True)
class _File:
    """A listed object as ``node_rows`` reads one (a bucket listing gives no time here)."""

    path: str
    size: int
    modified: float | None = None


def bucket_status(client: Any, clock: Any = time.time) -> dict[str, Any]:
    """The run in the bucket ``client`` reads: step, age, bytes per round, nodes, problems."""
    counted, problems = _step_count(client)
    files = [_File(item.path, item.size) for item in client.list(NODES_DIR)]
    sizes = {item.path: item.size for item in client.list("global")}
    if isinstance(counted.get("weights_key"), str):  # the object the step count names
        sizes[GLOBAL_WEIGHTS] = sizes.get(counted["weights_key"])
    return {"repo": client.url(), **run_summary(counted, files, sizes, clock(), problems)}


def _step_count(client: Any) -> tuple[dict[str, Any], list[str]]:
    got = client.get(STEP_COUNT, MAX_STEP_COUNT_BYTES)
    if got is None:
        return {}, []
    try:
        return parse_step_count(got.data), []
    except TransportError as exc:
        return {}, [str(exc)]

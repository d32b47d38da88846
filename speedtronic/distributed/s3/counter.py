"""Counting what a node spends on object storage: requests per operation, bytes, per hour.

Every attempt that goes on the wire is counted (retries included) under the S3 operation's
name, so the numbers are what the store bills and rate-limits, not what the code asked for.
Thread-safe (a node's uploader, poller and master threads share one); the hour is a sliding
window of timestamps. ``snapshot`` gives the flat, numbers-only dict the transport logs:
``s3_requests`` (all), ``s3_requests_1h``, one ``s3_<operation>`` per operation (``s3_put``,
``s3_get``, ``s3_list``, ``s3_delete``, ...), ``s3_retries``, ``s3_bytes_up``, ``s3_bytes_down``.
Stdlib only, no I/O.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

HOUR_S = 3600.0
# The S3 operations the transport uses, under the short names its stats are logged with
OPERATIONS = {
    "PutObject": "put",
    "GetObject": "get",
    "ListObjectsV2": "list",
    "DeleteObjects": "delete",
    "DeleteObject": "delete",
    "HeadBucket": "head_bucket",
    "CreateBucket": "create_bucket",
}


class RequestCounter:
    """Requests per operation, retries, bytes up and down; requests in the last hour."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._by_op: dict[str, int] = dict.fromkeys(sorted(set(OPERATIONS.values())), 0)
        self._recent: deque[float] = deque()
        self._totals = {"retries": 0, "bytes_up": 0, "bytes_down": 0}

    def request(self, operation: str) -> None:
        """One attempt of ``operation`` (an S3 API name) went on the wire."""
        name = OPERATIONS.get(operation, "other")
        with self._lock:
            self._by_op[name] = self._by_op.get(name, 0) + 1
            now = self.clock()
            self._recent.append(now)
            while self._recent and self._recent[0] <= now - HOUR_S:
                self._recent.popleft()

    def add(self, name: str, amount: int = 1) -> None:
        """``retries``, ``bytes_up`` or ``bytes_down``."""
        with self._lock:
            self._totals[name] += amount

    def requests(self, operation: str | None = None) -> int:
        """Attempts so far of one short-named operation (``put``...), or of all."""
        with self._lock:
            if operation is None:
                return sum(self._by_op.values())
            return self._by_op.get(operation, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            now = self.clock()
            last_hour = sum(1 for t in self._recent if t > now - HOUR_S)
            by_op = {f"s3_{name}": n for name, n in self._by_op.items()}
            totals = {f"s3_{name}": n for name, n in self._totals.items()}
            total = sum(self._by_op.values())
        return {"s3_requests": total, "s3_requests_1h": last_hour, **by_op, **totals}

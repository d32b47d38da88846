"""What a DumbDiLoCo fleet spends on object storage per hour: requests and bytes, by role.

Stores bill per request and per byte out, and a gateway may rate-limit both, so ``validate``
shows this for an ``s3://`` repo, and docs/storage.md and the fleet benchmark use the same
arithmetic. The request counts per operation are the transport's, as its tests pin them down
(tests/s3/test_transport.py): an idle worker poll is one GET of ``step_count.json`` (304 with no
body while it is unchanged), an idle master poll one LIST; a delta is one PUT by its worker and
one GET by the master; a publish is a PUT of the weights, a PUT of the pointer and one
DeleteObjects; each worker fetches a new global with a GET of the pointer and one of the
weights, at most once per poll. Stdlib only, no I/O: plain, testable arithmetic.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

HOUR_S = 3600.0
PUBLISH_REQUESTS = 3  # PUT weights, conditional PUT of step_count.json, DeleteObjects
GLOBAL_FETCH_REQUESTS = 2  # GET step_count.json (with a body), GET the weights


@dataclass(frozen=True)
class FleetCost:
    """Per hour, for ``workers`` workers and their master."""

    workers: int
    deltas: float  # uploaded by all workers
    publishes: float
    worker_requests: float  # each worker
    master_requests: float
    bytes_up: float  # into the store: deltas and published weights
    bytes_down: float  # out of it: deltas to the master, globals to every worker

    @property
    def requests(self) -> float:
        return self.master_requests + self.workers * self.worker_requests

    def as_dict(self) -> dict:
        return {**{k: round(v, 1) for k, v in asdict(self).items()}, "requests": self.requests}


def fleet_cost(
    *,
    workers: int,
    inner_steps: int,
    step_time_s: float,
    poll_interval_s: float,
    min_publish_interval_s: float,
    min_deltas: int,
    delta_bytes: int,
    weights_bytes: int,
    fetch_bytes: int | None = None,
) -> FleetCost:
    """The steady state of a fleet whose workers each finish an inner loop every
    ``inner_steps x step_time_s`` seconds; the master publishes at most once per poll and per
    ``min_publish_interval_s``, and only once ``min_deltas`` deltas have arrived.
    ``fetch_bytes``: what a worker downloads per publish when it is not the publish itself
    (``global_dtype: deltas``: the other nodes' deltas and the round record)."""
    workers = max(workers, 1)
    loop_s = max(inner_steps * step_time_s, 1e-9)
    polls = HOUR_S / poll_interval_s
    deltas = workers * HOUR_S / loop_s
    publishes = min(HOUR_S / max(min_publish_interval_s, poll_interval_s), deltas / min_deltas)
    fetches = min(publishes, polls)  # globals each worker downloads
    worker_requests = HOUR_S / loop_s + polls + fetches * (GLOBAL_FETCH_REQUESTS - 1)
    master_requests = polls + deltas + publishes * PUBLISH_REQUESTS
    return FleetCost(
        workers=workers,
        deltas=deltas,
        publishes=publishes,
        worker_requests=worker_requests,
        master_requests=master_requests,
        bytes_up=deltas * delta_bytes + publishes * weights_bytes,
        bytes_down=deltas * delta_bytes
        + workers * fetches * (weights_bytes if fetch_bytes is None else fetch_bytes),
    )


def describe(cost: FleetCost, step_time_s: float) -> str:
    """One line for ``validate``: the fleet's requests and bytes per hour."""
    return (
        f"{cost.workers} worker(s) at {step_time_s:g} s/step: {cost.requests:,.0f} requests/hour "
        f"(master {cost.master_requests:,.0f}, each worker {cost.worker_requests:,.0f}), "
        f"{_size(cost.bytes_up)} up and {_size(cost.bytes_down)} down per hour, "
        f"{cost.deltas:,.0f} deltas and {cost.publishes:,.0f} publishes"
    )


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} TB"

"""The latency fraction f of a DumbDiLoCo fleet: how long a delta takes to reach the repo,
against one inner loop. Stdlib only: ``validate`` prints it, and a worker suggests a poll
interval from its measured uploads.

f decides which settings pay off (docs/benchmarks.md, "DumbDiLoCo convergence"): the
convergence benchmark models upload and publish as f of an inner loop, download f/2, and polls
every f, and scores every policy at the same wall-clock time.
"""

from __future__ import annotations

DEFAULT_UPLINK_MBPS = 50.0  # a common office or home uplink; datacenters have 1,000 and more
REQUEST_RTT_S = 0.2  # one HTTPS round trip to a hosted service, handshake amortised
# Requests a delta upload takes on each kind of repo (docs/hub.md, docs/storage.md)
REQUESTS_PER_UPLOAD = {"directory": 0, "hub": 5, "s3": 1}


def upload_seconds(delta_bytes: int, kind: str, uplink_mbps: float) -> float:
    """Seconds to send one delta: its bytes at ``uplink_mbps`` plus the requests' round trips."""
    return delta_bytes * 8 / (uplink_mbps * 1e6) + REQUESTS_PER_UPLOAD.get(kind, 1) * REQUEST_RTT_S


def latency_fraction(upload_s: float, inner_steps: int, step_time_s: float) -> float:
    """f: an upload's time over one inner loop's."""
    return upload_s / max(inner_steps * step_time_s, 1e-9)


def suggested_poll_interval(upload_s: float, loop_s: float) -> float:
    """A poll interval that adds no more waiting than an upload does (a global waits half a
    poll interval on average before a node sees it), and at least 1 s."""
    return max(1.0, min(upload_s, loop_s / 8))


def latency_advice(f: float, inner_steps: int) -> str:
    """What f means for the settings, in one line, with the benchmark's figure for it (eval
    loss against one worker at equal wall-clock, the defaults: docs/diloco.md)."""
    if f <= 0.05:
        return "a fast link: the defaults measured 1.3% below one worker at f = 0.05"
    if f <= 0.25:
        return (
            "the network costs a share of each loop: eager installs (the default) hide most of "
            "it (+1.3% against one worker at f = 0.25, -1.3% at 0.05)"
        )
    need = int(inner_steps * f / 0.25) + 1
    return (
        f"a slow link: every setting loses to the wait (+13% and worse at f = 1.0); raise "
        f"distributed.inner_steps to about {need} for f = 0.25"
    )


def poll_advice(poll_interval_s: float, upload_s: float, loop_s: float) -> str | None:
    """One line when the poll interval is over twice what ``suggested_poll_interval`` gives."""
    suggested = suggested_poll_interval(upload_s, loop_s)
    if poll_interval_s <= 2 * suggested:
        return None
    return (
        f"distributed.poll_interval {poll_interval_s:g} s: a new global waits up to that long to "
        f"be seen, where an upload takes {upload_s:.1f} s and an inner loop {loop_s:.0f} s "
        f"(f = {upload_s / max(loop_s, 1e-9):.2f}); about {suggested:.0f} s would do"
    )

"""DumbDiLoCo's cadence against the Hub's budgets: what a run will spend, and which knob to turn.

``REQUESTS`` says what each DiLoCo operation costs, measured against the Hub emulator;
``cadence_warnings`` estimates what a configured run will spend and says, in one line per
budget, which knob to turn; ``observed_commit_warning`` does the same from the commits the
master sees arriving, once the fleet's real size and pace are known. Stdlib only, no I/O: all
are plain, testable arithmetic.
"""

from __future__ import annotations

import math
from typing import Any

from speedtronic.hub.budget import HUB_CALLS_PER_5_MIN, HUB_COMMITS_PER_HOUR

# Warn before the limit itself: retries after transient failures spend calls and commits
# too, and the call budget is shared with anything else the account does.
WARN_FRACTION = 0.8

# What each operation costs without failures, as (Hub API calls, storage requests), measured
# against the Hub emulator answering as the Hub does (tests/hub/test_lfs.py holds them to it).
# Every delta and global is a *.safetensors file, so it takes the Git LFS path.
REQUESTS = {
    "idle_poll": (1, 0),  # head; a listing only when the head moved (+1 call)
    "delta_upload": (4, 1),  # preupload, LFS batch, verify, commit; the PUT to storage
    "delta_read": (1, 1),  # the master's download: resolve (302 to storage); the GET there
    "publish": (6, 1),  # paths-info, a preupload per file (2), batch, verify, commit; the PUT
    "global_read": (2, 1),  # a worker: step_count.json, the weights' resolve; their GET
}
POLL_CALLS = REQUESTS["idle_poll"][0] + 1  # estimates count every poll as one that moved
UPLOAD_CALLS = REQUESTS["delta_upload"][0] + REQUESTS["delta_read"][0]  # the worker's + master's
PUBLISH_COMMIT_CALLS = REQUESTS["publish"][0]
GLOBAL_READ_CALLS = REQUESTS["global_read"][0]  # each worker, for each new global


def estimate_commits_per_hour(
    *,
    nodes: int,
    inner_steps: int,
    step_time_s: float,
    min_publish_interval_s: float,
    keyframe_every: int = 0,
) -> float:
    """Workers' delta commits plus the master's publishes, per hour.

    A worker commits one delta per inner loop; the master publishes at most once per
    ``min_publish_interval_s`` and never faster than deltas arrive. With ``keyframe_every``
    (``global_dtype`` int8 / int4 / deltas: 0 for fp32) every that many publishes also upload
    a keyframe first, a commit of its own.
    """
    loop_s = max(inner_steps * step_time_s, 1e-9)
    arrival_s = loop_s / max(nodes, 1)
    publishes = 3600.0 / max(min_publish_interval_s, arrival_s)
    return nodes * 3600.0 / loop_s + publishes * publish_commits(keyframe_every)


def publish_commits(keyframe_every: int) -> float:
    """Commits per publish: one, plus a keyframe's upload every ``keyframe_every`` of them."""
    return 1.0 + (1.0 / keyframe_every if keyframe_every > 0 else 0.0)


def keyframes_every(settings) -> int:
    """A ``distributed`` section's publishes per keyframe commit: 0 with ``global_dtype`` fp32
    (full weights in every publish, no keyframe); configs that predate it count as fp32."""
    if getattr(settings, "global_dtype", "fp32") == "fp32":
        return 0
    return int(getattr(settings, "keyframe_every", 0) or 0)


def estimate_calls_per_5min(
    *,
    nodes: int,
    inner_steps: int,
    step_time_s: float | None,
    poll_interval_s: float,
    min_publish_interval_s: float,
) -> float:
    """API calls per 5 minutes for the whole run (one account): polls, uploads, publishes.

    Every node and the master poll; without a step time only the polls are counted.
    """
    polls = (nodes + 1) * 300.0 / poll_interval_s * POLL_CALLS
    if step_time_s is None:
        return polls
    loop_s = max(inner_steps * step_time_s, 1e-9)
    uploads = nodes * 300.0 / loop_s * UPLOAD_CALLS
    publish_s = max(min_publish_interval_s, loop_s / max(nodes, 1))
    publishes = 300.0 / publish_s * (PUBLISH_COMMIT_CALLS + nodes * GLOBAL_READ_CALLS)
    return polls + uploads + publishes


def request_facts(
    *,
    inner_steps: int,
    poll_interval_s: float,
    min_publish_interval_s: float,
    step_time_s=1.0,
    keyframe_every: int = 0,
) -> dict:
    """What ``speedtronic validate`` says about a Hub run: each operation's requests, and one
    worker's and the master's spend at ``step_time_s`` against the Hub's limits."""
    spend = dict(nodes=1, inner_steps=inner_steps, step_time_s=step_time_s)
    calls = estimate_calls_per_5min(
        **spend, poll_interval_s=poll_interval_s, min_publish_interval_s=min_publish_interval_s
    )
    commits = estimate_commits_per_hour(
        **spend, min_publish_interval_s=min_publish_interval_s, keyframe_every=keyframe_every
    )
    return {
        "diloco_hub_requests": {k: {"api": a, "storage": s} for k, (a, s) in REQUESTS.items()},
        f"diloco_hub_budget_one_worker_at_{step_time_s:g}s_per_step": {
            "api_calls_per_5min": round(calls),
            "api_calls_limit_per_5min": HUB_CALLS_PER_5_MIN,
            "commits_per_hour": round(commits),
            "commits_limit_per_hour": HUB_COMMITS_PER_HOUR,
        },
    }


def cadence_warnings(
    *,
    nodes: int,
    inner_steps: int,
    step_time_s: float | None,
    poll_interval_s: float,
    min_publish_interval_s: float,
    keyframe_every: int = 0,
) -> list[str]:
    """One line per Hub budget the configured cadence would exceed, naming the knob to turn.

    ``nodes`` is the number of workers; ``step_time_s`` the seconds per optimizer step (None
    when not measured yet: only the polling part is estimated then); ``keyframe_every`` as
    for ``estimate_commits_per_hour``.
    """
    warnings = []
    commit_cap = HUB_COMMITS_PER_HOUR * WARN_FRACTION
    step_time_s = step_time_s if step_time_s and step_time_s > 0 else None
    if step_time_s is not None:
        commits = estimate_commits_per_hour(
            nodes=nodes,
            inner_steps=inner_steps,
            step_time_s=step_time_s,
            min_publish_interval_s=min_publish_interval_s,
            keyframe_every=keyframe_every,
        )
        if commits > commit_cap:
            per_publish = publish_commits(keyframe_every)
            warnings.append(
                _commit_warning(commits, nodes, step_time_s, min_publish_interval_s, per_publish)
            )
    calls = estimate_calls_per_5min(
        nodes=nodes,
        inner_steps=inner_steps,
        step_time_s=step_time_s,
        poll_interval_s=poll_interval_s,
        min_publish_interval_s=min_publish_interval_s,
    )
    if calls > HUB_CALLS_PER_5_MIN * WARN_FRACTION:
        warnings.append(_call_warning(calls, nodes, poll_interval_s))
    return warnings


def settings_warnings(
    settings: Any, *, nodes: int, step_time_s: float | None, min_publish_interval_s: float
) -> list[str]:
    """``cadence_warnings`` for a ``distributed`` section: its H, polls and keyframes."""
    return cadence_warnings(
        nodes=nodes,
        inner_steps=settings.inner_steps,
        step_time_s=step_time_s,
        poll_interval_s=settings.poll_interval,
        min_publish_interval_s=min_publish_interval_s,
        keyframe_every=keyframes_every(settings),
    )


def _commit_warning(
    commits: float, nodes: int, step_time_s: float, publish_s: float, per_publish: float = 1.0
) -> str:
    cap = HUB_COMMITS_PER_HOUR * WARN_FRACTION
    # The publishes (and their keyframes) take their share first (at most 3600/publish_s
    # publishes an hour); the workers' deltas must fit in the rest.
    publishes = 3600.0 / publish_s * per_publish if publish_s > 0 else cap
    room = cap - publishes
    if room > 0:
        need = math.ceil(nodes * 3600.0 / (room * step_time_s))
        knob = (
            f"raise distributed.inner_steps to at least {need} "
            f"(or distributed.min_publish_interval_s, now {publish_s:g} s)"
        )
    else:
        knob = (
            f"raise distributed.min_publish_interval_s above {3600.0 * per_publish / cap:.0f} s "
            f"(now {publish_s:g} s), then distributed.inner_steps"
        )
    verdict = (
        "this cadence cannot fit one Hub repo"
        if commits > HUB_COMMITS_PER_HOUR
        else "too near the limit for one Hub repo (retries spend commits too)"
    )
    return (
        f"Hub commit budget: {nodes} worker(s) at {step_time_s:.3g} s/step would make about "
        f"{commits:.0f} commits/hour on the repo, over {cap:.0f} ({WARN_FRACTION:.0%} of the "
        f"Hub's ~{HUB_COMMITS_PER_HOUR}/hour): {verdict}; {knob}; "
        f"or keep it in a bucket, which has no commit budget (distributed.repo_id: "
        f"s3://BUCKET/PREFIX, docs/storage.md)"
    )


def _call_warning(calls: float, nodes: int, poll_interval_s: float) -> str:
    cap = HUB_CALLS_PER_5_MIN * WARN_FRACTION
    polls = (nodes + 1) * 300.0 / poll_interval_s * POLL_CALLS
    other = calls - polls
    if other < cap:
        need = math.ceil((nodes + 1) * 300.0 * POLL_CALLS / (cap - other))
        knob = f"raise distributed.poll_interval to at least {need} s (now {poll_interval_s:g} s)"
    else:
        knob = "raise distributed.inner_steps so nodes upload less often"
    return (
        f"Hub API budget: {nodes} worker(s) and the master would make about {calls:.0f} API "
        f"calls per 5 minutes, over {cap:.0f} ({WARN_FRACTION:.0%} of the "
        f"{HUB_CALLS_PER_5_MIN} a free account gets, shared by all its nodes); {knob}"
    )


def observed_commit_warning(
    *, deltas_per_hour: float, publishes_per_hour: float, inner_steps: int
) -> str | None:
    """A line naming the knob when the repo's observed commit rate nears the Hub's limit.

    Deltas arrive at a rate proportional to 1 / inner_steps; publishes (and squashes) take
    their share first, the deltas must fit in the rest.
    """
    cap = HUB_COMMITS_PER_HOUR * WARN_FRACTION
    total = deltas_per_hour + publishes_per_hour
    if total <= cap:
        return None
    room = cap - publishes_per_hour
    if room > 0 and deltas_per_hour > 0:
        need = math.ceil(inner_steps * deltas_per_hour / room)
        knob = f"raise distributed.inner_steps from {inner_steps} to at least {need}"
    else:
        knob = "raise distributed.min_publish_interval_s"
    return (
        f"the repo is taking {total:.0f} commits an hour ({deltas_per_hour:.0f} deltas, "
        f"{publishes_per_hour:.0f} of this master's); the Hub refuses beyond about "
        f"{HUB_COMMITS_PER_HOUR} an hour per repo: {knob}"
    )

"""Whether a worker takes part in its run at all (issue 55), said in one line either way.

``refuse_to_join``: a worker on another frozen base than its run's is refused first (issue 56:
the deeper mismatch, which no restart of the master cures); then a worker that starts afresh
(no checkpoint) on a run whose master has
ended it (the step count says ``ended``: the master ran its final round after waiting for every
node that had announced itself) has nothing to join, as its deltas would reach no round; it is
told so before it reads the global or trains a step (exit 2). Until that publish any worker
joins as any node does, and a master that waits for the fleet waits for it too (its
``node.json``). A node resumed from its checkpoint goes on (it sends what it holds unsent, or
continues a run whose master is started again), and a master's own worker is the master's
call. A repo of an earlier master never says ``ended``: a worker joins it as before.
``unreached_line``: a worker that never reached its repo (no delta out, no global in) took no
part, and its run ends with exit 1 and this line rather than 0 (``worker/end``). A Hub repo id
and a relative path are spelled alike, so the line says when no such directory is here either
(``hub.names``, through the composition root: the worker knows only its transport).
"""

from __future__ import annotations

from typing import Any

from speedtronic.distributed.frozen_base import check_base
from speedtronic.distributed.protocol import run_ended
from speedtronic.errors import ConfigError


class RunEnded(ConfigError):
    """The run this worker would join has ended (exit 2, before its first step)."""

    permanent = True  # the start's handling of a repo it cannot read lets it through


def refuse_to_join(plugin: Any, counted: dict[str, Any] | None) -> None:
    """``BaseMismatch`` when ``counted`` (the repo's step count when a worker starts) names
    another frozen base, ``RunEnded`` when it says the run has ended; nothing otherwise."""
    if counted is not None:
        check_base(counted, plugin.fetcher.base_sha256, plugin.transport.describe())
    if not run_ended(counted) or getattr(plugin.config, "role", "worker") == "master":
        return
    where = plugin.transport.describe()
    raise RunEnded(
        f"diloco: the run in {where} ended at outer step {counted['outer_step']} (its master "
        f"ran the final round): nothing to join, so {plugin.node_id} trains nothing",
        # this node's own output directory holds no model config yet: pull reads a node's of the run
        hint=f"start a new run in another repo (and state_dir), or restart its master to go on; "
        f"`speedtronic storage pull <output_dir of a node of that run> --repo {where}` fetches "
        "its final global",
    )


def unreached_line(plugin: Any) -> str:
    """The one line of a worker that never reached its repo: no delta out, no global in;
    ``plugin.end.repo_note`` (set where the spec is read, ``distributed/setup``) says when no
    such directory is here either."""
    where, note = plugin.transport.describe(), plugin.end.repo_note
    return (
        f"diloco: {plugin.node_id} never reached {where}: no delta went out and no global came "
        "in, so it took no part in the run (the warnings above say why)"
        + (f"; {note}" if note else "")
        + "; its deltas wait in its checkpoint, and --resume sends them"
    )

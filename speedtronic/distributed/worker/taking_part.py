"""Whether a worker takes part in its run at all (issue 55), said in one line either way.

``refuse_ended_run``: a worker new to a run whose final global is out (every node in it has
ended, longer ago than its master may still wait for nodes that join, and no other node has
announced itself) has nothing to join, as its deltas would reach no round; it is told so before
its first step (exit 2). A worker that joins sooner is taken as any other node: nodes started
together were seen 30 s apart on a loaded machine. A node of the run restarted without its
checkpoint goes on as before, and a master's own worker is the master's call.
``unreached_line``: a worker that never reached its repo (no delta out, no global in) took no
part, and its run ends with exit 1 and this line rather than 0 (``worker/end``). A Hub repo id
and a relative path are spelled alike, so the line says when no such directory is here either
(``hub.names``, through the composition root: the worker knows only its transport).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from speedtronic.distributed.master.roster import JOIN_GRACE_S
from speedtronic.distributed.protocol import ANNOUNCEMENT, announced_node, fleet_totals
from speedtronic.errors import ConfigError


def refuse_ended_run(plugin: Any, ready: Any) -> None:
    """ConfigError when ``ready`` (the worker's first global) ends a run ``plugin``'s node is
    new to and the master can no longer be taking nodes; nothing otherwise (when in doubt:
    the master may still be in its wait for nodes that join late, and takes this one)."""
    if ready is None or getattr(plugin.config, "role", "worker") == "master":
        return
    if plugin.node_id in ready.nodes or not fleet_totals(ready.nodes)["ended"]:
        return
    ended_s = time.time() - max(_stamp(e.get("last_delta_at")) for e in ready.nodes.values())
    if ended_s < master_may_wait_s(plugin.config) or _announced_others(plugin, ready.nodes):
        return
    where = plugin.transport.describe()
    out = getattr(plugin.end.final_writer, "output_dir", None) or "<output_dir>"
    raise ConfigError(
        f"diloco: the run in {where} has ended (its final global, outer step "
        f"{ready.outer_step}, is out: every node in it ended, the last {ended_s:.0f} s ago): "
        "nothing to join",
        hint=f"start a new run in another repo; `speedtronic storage pull {out} --repo "
        f"{where}` fetches the final global",
    )


def master_may_wait_s(config: Any) -> float:
    """How long after a fleet's last delta its master may still take a node that joins: its
    wait for nodes not seen yet (``JOIN_GRACE_S``, at least three polls), two more polls and
    its final publish's retries, plus a minute for clocks and a loaded machine."""
    poll = float(getattr(config, "poll_interval", 60.0))
    upload = float(getattr(config, "upload_timeout_s", 60.0) or 0.0)
    return max(JOIN_GRACE_S, 3 * poll) + 2 * poll + upload + 60.0


def _announced_others(plugin: Any, nodes: dict) -> bool:
    """Whether a node not in the global has announced itself: the master waits for it, and
    so takes this one too (unsure when the repo cannot be listed: True)."""
    try:
        refs = plugin.transport.list_deltas()
    except Exception:  # the start goes on; the poller reports the repo's trouble
        return True
    return any(
        (node := announced_node(r.path)) is not None and node not in nodes
        for r in refs
        if r.problem == ANNOUNCEMENT
    )


def _stamp(text: Any) -> float:
    """A delta's ``created_at`` as wall-clock seconds; now when it is unreadable (no refusal)."""
    try:
        stamp = datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return time.time()
    return stamp.replace(tzinfo=timezone.utc).timestamp()


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

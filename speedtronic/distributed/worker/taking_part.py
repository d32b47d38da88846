"""Whether a worker takes part in its run at all (issue 55), said in one line either way.

``refuse_ended_run``: a worker new to a run whose final global is out (every node in it has
ended, and the master ends then) has nothing to join, as its deltas would reach no round; it is
told so before its first step (exit 2). A node of the run restarted without its checkpoint goes
on as before, and a master's own worker is the master's call. ``unreached_line``: a worker that
never reached its repo (no delta out, no global in) took no part, and its run ends with exit 1
and this line rather than 0 (``worker/end``). A Hub repo id and a relative path are spelled
alike, so the line says when no such directory is here either (``hub.names``, through the
composition root: the worker knows only its transport).
"""

from __future__ import annotations

from typing import Any

from speedtronic.distributed.protocol import fleet_totals
from speedtronic.errors import ConfigError


def refuse_ended_run(plugin: Any, ready: Any) -> None:
    """ConfigError when ``ready`` (the worker's first global) ends a run ``plugin``'s node is
    new to; nothing otherwise."""
    if ready is None or getattr(plugin.config, "role", "worker") == "master":
        return
    if plugin.node_id in ready.nodes or not fleet_totals(ready.nodes)["ended"]:
        return
    where = plugin.transport.describe()
    out = getattr(plugin.end.final_writer, "output_dir", None) or "<output_dir>"
    raise ConfigError(
        f"diloco: the run in {where} has ended (its final global, outer step "
        f"{ready.outer_step}, is out and every node in it has ended): nothing to join",
        hint=f"start a new run in another repo; `speedtronic storage pull {out} --repo "
        f"{where}` fetches the final global",
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

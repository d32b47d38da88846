"""What ``hub status`` and ``storage status`` show of a run, whatever holds it: per-node rows
(pending deltas, the newest one's size, staleness) from a listing and ``step_count.json``'s
``nodes``, the global's bytes per round, times, and whether the master has ended the run;
``directory_status`` reads a shared directory for it (the Hub's and a bucket's readers live in
their rooms). Stdlib only.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from speedtronic.distributed.protocol import (
    GLOBAL_WEIGHTS,
    KEYFRAMES_DIR,
    NODES_DIR,
    announced_node,
    is_keyframe_path,
    parse_delta_path,
    run_ended,
)
from speedtronic.distributed.transport import LocalTransport
from speedtronic.errors import DamagedRepoFile


def run_summary(
    counted: dict[str, Any], files: list[Any], sizes: dict[str, int], now: float, problems: list
) -> dict[str, Any]:
    """The run as ``step_count.json`` (``counted``), the listing of ``nodes/`` (``files``) and
    the sizes under ``global/`` say: step and age, a round's bytes, per-node rows, and the
    ``problems`` found, with the files under ``nodes/`` that are not ours added."""
    nodes = node_rows(files, counted, now)
    others = sum(  # a node's announcement (node.json) is ours, not a stranger
        parse_delta_path(f.path) is None and announced_node(f.path) is None for f in files
    )
    if others:
        problems = [*problems, f"{others} file(s) under {NODES_DIR}/ are not deltas: ignored"]
    updated = unix_time(counted.get("updated_at"))
    return {
        "checked_at": iso(now),
        "outer_step": counted.get("outer_step"),
        "ended": run_ended(counted),  # the master ran the final round: nothing to join
        "updated_at": iso(updated),
        "age_s": age(updated, now),
        "pending_deltas": sum(n["pending_deltas"] for n in nodes),
        **global_bytes(sizes),
        "nodes": nodes,
        "problems": problems,
        "base_sha256": counted.get("base_sha256"),  # a fleet that fine-tunes: its frozen base
    }


def directory_status(transport: LocalTransport, clock: Any = time.time) -> dict[str, Any]:
    """The run in a shared directory, as ``run_summary`` tells it, read as nodes read it: no
    link followed, ``step_count.json`` checked (a damaged one is a problem, not a failure)."""
    counted, problems = {}, []
    try:
        counted = transport.read_step_count() or {}
    except DamagedRepoFile as exc:  # the file's content, not the directory, is wrong
        problems.append(str(exc))
    refs = transport.list_deltas()
    # a link or a folder under a delta's name is no delta: run_summary goes by names alone
    strangers = sum(r.problem is not None and announced_node(r.path) is None for r in refs)
    if strangers:
        problems.append(f"{strangers} file(s) under {NODES_DIR}/ are not deltas: ignored")
    files = [r for r in refs if r.problem is None or announced_node(r.path) is not None]
    sizes = {**transport.file_sizes("global"), **transport.file_sizes(KEYFRAMES_DIR)}
    summary = run_summary(counted, files, sizes, clock(), problems)
    return {"repo": transport.describe(), **summary}


def node_rows(files: list[Any], counted: dict[str, Any], now: float) -> list[dict[str, Any]]:
    """Per node: pending deltas from the listing, the rest from step_count's ``nodes`` map."""
    pending: dict[str, list[Any]] = {}
    for f in files:
        parsed = parse_delta_path(f.path)
        if parsed is not None:
            pending.setdefault(parsed[0], []).append(f)
    known = counted.get("nodes") if isinstance(counted.get("nodes"), dict) else {}
    outer_step = counted.get("outer_step")
    rows = []
    for node in sorted(set(pending) | {n for n in known if isinstance(n, str)}):
        info = known.get(node) if isinstance(known.get(node), dict) else {}
        mine = pending.get(node, [])
        times = [f.modified for f in mine if f.modified is not None]
        newest = max(times) if times else None
        applied = unix_time(info.get("last_delta_at"))
        last = max((t for t in (newest, applied) if t is not None), default=None)
        base = _count(info.get("base_outer_step"))
        rows.append(
            {
                "node_id": node,
                "pending_deltas": len(mine),
                "pending_bytes": sum(f.size for f in mine),
                # a round's upload: the newest delta's size (the listing's, when one is there)
                "delta_bytes": max(mine, key=lambda f: parse_delta_path(f.path)[1]).size
                if mine
                else None,
                "newest_pending_at": iso(newest),
                "newest_pending_age_s": age(newest, now),
                "last_delta_at": iso(last),
                "last_delta_age_s": age(last, now),
                "base_outer_step": base,
                "staleness_steps": None
                if base is None or not isinstance(outer_step, int)
                else max(outer_step - base, 0),
                "tokens": _count(info.get("tokens")),
            }
        )
    return rows


def global_bytes(sizes: dict[str, int]) -> dict[str, int | None]:
    """What a node downloads per round (the file at ``global/latest.safetensors``) and, for an
    update, once (its keyframe: the newest under ``global/keyframes/``)."""
    keyframes = sorted(path for path in sizes if is_keyframe_path(path))
    return {
        "global_bytes": sizes.get(GLOBAL_WEIGHTS),
        "keyframe_bytes": sizes[keyframes[-1]] if keyframes else None,
    }


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def unix_time(value: Any) -> float | None:
    """Seconds since the epoch from a number or an ISO 8601 string (``Z`` allowed); else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).timestamp()


def iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def age(seconds: float | None, now: float) -> float | None:
    return None if seconds is None else round(max(now - seconds, 0.0), 1)

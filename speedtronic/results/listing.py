"""Every run under some directories, one row each: what ``speedtronic runs`` lists.

A run directory holds ``summary.json`` (written when a run ends), ``checkpoints/`` (written
while it trains), ``diloco_master/`` (a DumbDiLoCo master's state) or ``.running`` (``train``'s
marker, there from its first step). The summary says it all; without one (a run killed with
-9, one made before summaries, one still training) the row comes from the newest checkpoint's
meta.json and the metrics JSONL's head and tail, whichever is newer. Only files inside the run's
directory describe it: a stored path is never resolved against the caller's working
directory. Every file is read with a bound, so a corrupt or a 100 MB file costs its row a
``problem``, never a traceback, and 1,000 runs list in well under a second
(``benchmarks/observe/runs_list.py``).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from speedtronic.checkpoint.inspection import metrics_file_for
from speedtronic.checkpoint.layout import (
    LATEST_FILE,
    META_FILE,
    list_step_dirs,
    list_tmp_dirs,
    parse_tmp_pid,
)
from speedtronic.errors import ConfigError, DataError
from speedtronic.liveness import marker_alive
from speedtronic.observe.history import finite
from speedtronic.readlimit import MIB, read_json

SUMMARY_FILE = "summary.json"
RUNNING_FILE = ".running"  # = observe.running.RUNNING_FILE: names the process while a run trains
MASTER_DIR = "diloco_master"  # distributed.state_dir's default, inside the output dir
FILE_LIMIT = 4 * MIB  # summary.json and meta.json: a few KiB each when sound
TAIL_BYTES = 64 << 10  # of the metrics JSONL: its last records say how the run ended
MAX_DEPTH = 4  # runs/<sweep>/<group>/<run>: deep enough, and a wrong DIR stays quick
RECENT_S = 120.0  # a metrics JSONL written this recently, with no run_end: still training
# --sort names -> row keys (the text table's headers too).
COLUMNS = {
    "name": "name",
    "status": "status",
    "steps": "steps",
    "tokens": "tokens",
    "time": "train_s",
    "params": "params",
    "optimizer": "optimizer",
    "loss": "final_loss",
    "eval_loss": "best_eval_loss",
    "bpb": "bits_per_byte",
    "tokens_per_s": "tokens_per_s",
    "role": "role",
}
HEAD_BYTES = 16 << 10  # of a JSONL with no checkpoint beside it: its run_start (name, params)
RUN_MARKS = (SUMMARY_FILE, "checkpoints", MASTER_DIR, RUNNING_FILE)
_END_STATUS = {"completed": "completed", "at_target": "completed", "stopped": "stopped"}
_TAIL_WORDS = ('"run_start"', '"run_end"', '"eval"', '"outer_step"')
_MANIFEST = re.compile(r"step_(\d{10})\.json")


def find_runs(roots: list[Path]) -> list[tuple[str, Path]]:
    """``(name, dir)`` of every run under ``roots``; the name is the dir relative to its root
    (a root that is itself a run: its own name). A root that is no directory: ConfigError."""
    found: dict[Path, tuple[str, Path]] = {}
    for root in roots:
        if not root.is_dir():
            what = "does not exist" if not root.exists() else "is not a directory"
            raise ConfigError(f"{root} {what}", hint="pass the directory your runs are in")
        for name, path in _walk(root):
            found.setdefault(path.resolve(), (name, path))
    return sorted(found.values())


def _walk(root: Path) -> list[tuple[str, Path]]:
    runs, todo = [], [(root, 0)]
    while todo:
        folder, depth = todo.pop()
        names = _entries(folder)
        if any(n in names for n in RUN_MARKS):
            runs.append(
                (folder.name if folder == root else folder.relative_to(root).as_posix(), folder)
            )
            continue  # a run's own folders (checkpoints, logs) hold no other run
        if depth < MAX_DEPTH:
            todo += [(folder / n, depth + 1) for n, is_dir in names.items() if is_dir]
    return runs


def _entries(folder: Path) -> dict[str, bool]:
    """Names in ``folder`` -> is a directory (hidden ones left out: tmp dirs, caches; but
    ``.running``, which marks a run that may have nothing else yet)."""
    try:
        with os.scandir(folder) as it:
            return {
                e.name: e.is_dir()
                for e in it
                if not e.name.startswith(".") or e.name == RUNNING_FILE
            }
    except OSError:
        return {}


def list_runs(roots: list[Path]) -> list[dict[str, Any]]:
    """One row (``read_run``) per run under ``roots``, by name."""
    return [read_run(path, name)["row"] for name, path in find_runs(roots)]


def sort_rows(rows: list[dict[str, Any]], column: str) -> list[dict[str, Any]]:
    """Rows by ``column`` (a ``COLUMNS`` name), smallest first, unknown values last."""
    if column not in COLUMNS:
        raise ConfigError(f"--sort: unknown column {column!r}; one of: {', '.join(COLUMNS)}")
    key = COLUMNS[column]
    known = [r for r in rows if r.get(key) is not None]
    known.sort(key=lambda r: str(r[key]).lower() if isinstance(r[key], str) else r[key])
    return known + [r for r in rows if r.get(key) is None]


def read_run(path: Path, name: str) -> dict[str, Any]:
    """``{"row", "config", "tokenizer", "curve", "metrics"}`` of the run in ``path``.

    ``curve`` is the summary's (None without one: ``runs compare`` reads the metrics JSONL,
    ``metrics``, instead). A file that cannot be read is named in ``row["problem"]``.
    """
    problems: list[str] = []
    summary = _read_dict(path / SUMMARY_FILE, problems) if (path / SUMMARY_FILE).exists() else None
    if summary is not None:
        found = _from_summary(path, name, summary)
    else:
        found = _from_checkpoints(path, name, problems)
    marked = _marker_status(path / RUNNING_FILE)
    if marked is not None:  # a live train, or one killed before it could say how it ended
        found["row"]["status"] = marked
    if summary is not None:
        return found
    if problems:
        found["row"]["problem"] = "; ".join(problems)
        alone = marked is None and not (path / "checkpoints").is_dir()
        if alone and (path / SUMMARY_FILE).exists():  # a summary we cannot read, nothing else
            found["row"]["status"] = "unknown"
    return found


def _read_dict(path: Path, problems: list[str]) -> dict[str, Any] | None:
    try:
        doc = read_json(path, FILE_LIMIT, error=DataError)
    except ConfigError as exc:
        problems.append(str(exc))
        return None
    if not isinstance(doc, dict):
        problems.append(f"{path}: not a JSON object")
        return None
    return doc


def _from_summary(path: Path, name: str, s: dict[str, Any]) -> dict[str, Any]:
    status = s.get("status") if s.get("status") in ("completed", "stopped", "failed") else None
    evals = _eval_sets(s.get("eval"))
    curve = s.get("curve") if isinstance(s.get("curve"), dict) else {}
    curve_evals = [p[4] for p in _points(curve.get("eval"), 6) if finite(p[4]) is not None]
    row = _row(name, path, "summary")
    row.update(
        run_name=_text(s.get("name")),
        status=status or "unknown",
        error=_text(s.get("error")),
        stop_reason=_text(s.get("stop_reason")),
        steps=_count(s.get("steps")),
        tokens=_count(s.get("tokens")),
        train_s=finite(s.get("train_s")),
        params=_count(s.get("params")),
        optimizer=_text(s.get("optimizer")),
        final_loss=finite(s.get("final_train_loss")),
        best_eval_loss=_least(curve_evals + [e["loss"] for e in evals.values()]),
        bits_per_byte=next(
            (e["bits_per_byte"] for e in evals.values() if e["bits_per_byte"]), None
        ),
        tokens_per_s=finite(s.get("tokens_per_s")),
        role=_text(s.get("role")),
        node_id=_text(s.get("node_id")),
        outer_step=_count(s.get("outer_step")),
        started_at=_text(s.get("started_at")),
        ended_at=_text(s.get("ended_at")),
        eval=evals,
    )
    if status is None:
        row["problem"] = f"{path / SUMMARY_FILE}: status {s.get('status')!r} is not one of ours"
    config = s.get("config") if isinstance(s.get("config"), dict) else {}
    return {
        "row": row,
        "config": config,
        "tokenizer": s.get("tokenizer"),
        "curve": curve,
        "metrics": None,
    }


def _row(name: str, path: Path, source: str) -> dict[str, Any]:
    keys = ("run_name", "error", "stop_reason", "steps", "tokens", "train_s", "params")
    keys += ("optimizer", "final_loss", "best_eval_loss", "bits_per_byte", "tokens_per_s")
    keys += ("role", "node_id", "outer_step", "started_at", "ended_at", "problem")
    return {
        "name": name,
        "path": str(path),
        "status": "unknown",
        "source": source,
        **dict.fromkeys(keys),
        "eval": {},
    }


def _from_checkpoints(path: Path, name: str, problems: list[str]) -> dict[str, Any]:
    """The row of a run without summary.json: its newest readable meta.json, and its metrics
    JSONL (how it ended, its speed, a worker's outer step; how far it got when that is past
    its newest checkpoint, or when it has none: a run training or killed before its first)."""
    root = path / "checkpoints"
    meta = _newest_meta(root, problems)
    config = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    metrics = _own_log(path, config, problems)
    tail = _tail_records(metrics, problems) if metrics is not None else []
    start = _head_start(metrics) if metrics is not None and not meta else {}
    end = next((r for r in reversed(tail) if r.get("event") == "run_end"), {})
    speed = next((r for r in reversed(tail) if "tokens_per_s" in r), {})
    role, node_id = _node(path, config)
    evals = _eval_sets(meta.get("eval_sets"))
    set_losses = [e["loss"] for e in evals.values()]
    logged = [finite(r.get("eval_loss")) for r in tail if r.get("event") == "eval"]
    row = _row(name, path, "checkpoints" if meta else "log")
    row.update(
        run_name=_text(_get(config, "run.name")) or _text(start.get("name")),
        status=_status(root, metrics, tail),
        steps=_count(meta.get("step")) if meta else _count(end.get("steps")),
        tokens=_count(meta.get("tokens")) if meta else _count(end.get("tokens")),
        train_s=finite(end.get("elapsed_s")),
        params=_count(meta.get("param_count")) or _count(start.get("params")),
        optimizer=_text(_get(config, "optimizer.name")) or _first_word(start.get("optimizer")),
        final_loss=finite(meta.get("loss")) if meta else finite(end.get("final_loss")),
        best_eval_loss=_least([_loss_of(meta.get("eval_loss")), *logged, *set_losses]),
        bits_per_byte=next(
            (e["bits_per_byte"] for e in evals.values() if e["bits_per_byte"]), None
        ),
        tokens_per_s=finite(speed.get("tokens_per_s")),
        role=role,
        node_id=node_id,
        outer_step=_outer_step(path, config, role, tail),
        ended_at=_text(meta.get("created_at")),
        eval=evals,
    )
    _newer_from_log(row, tail)
    return {
        "row": row,
        "config": config,
        "tokenizer": meta.get("tokenizer"),
        "curve": None,
        "metrics": metrics,
    }


def _own_log(path: Path, config: dict[str, Any], problems: list[str]) -> Path | None:
    """The run's metrics JSONL, inside its directory (or at its absolute ``logging.json_file``);
    a log its config names that is not there is a problem: no curve, never another run's."""
    metrics = metrics_file_for(path, config)
    named = _get(config, "logging.json_file")
    if metrics is None and isinstance(named, str) and named:
        where = Path(named) if Path(named).is_absolute() else path / named
        what = "is not a regular file" if where.exists() else "is missing"
        problems.append(f"its metrics log {where} {what}: no curve, time or speed")
    return metrics


def _newer_from_log(row: dict[str, Any], tail: list[dict[str, Any]]) -> None:
    """Steps, tokens and loss from the log's last train_step when it is past the newest
    checkpoint (or there is none): how far the run got, as W&B shows a run as it logs."""
    last = next((r for r in reversed(tail) if r.get("event") == "train_step"), {})
    step = _count(last.get("step"))
    if step is None or (row["steps"] is not None and step <= row["steps"]):
        return
    row.update(steps=step, tokens=_count(last.get("tokens")), final_loss=finite(last.get("loss")))


def _head_start(path: Path) -> dict[str, Any]:
    """The first ``run_start`` in the first ``HEAD_BYTES`` of a metrics JSONL ({} if none): a
    run with no checkpoint yet is named, sized and its optimizer told by it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            if not os.path.isfile(path):
                return {}
            lines = handle.read(HEAD_BYTES).decode("utf-8", "replace").splitlines()
    except OSError:
        return {}
    for line in (ln for ln in lines if '"run_start"' in ln):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict) and record.get("event") == "run_start":
            return record
    return {}


def _newest_meta(root: Path, problems: list[str]) -> dict[str, Any]:
    """latest.json's checkpoint's meta.json, else the newest one that reads; {} if none."""
    dirs = list_step_dirs(root)
    latest = _read_dict(root / LATEST_FILE, problems) if (root / LATEST_FILE).exists() else None
    pointed = latest.get("path") if latest else None
    dirs.sort(key=lambda d: d.name == pointed)  # stable: latest.json's last, then by step
    for folder in reversed(dirs[-3:]):
        meta = _read_dict(folder / META_FILE, problems)
        if meta is not None:
            return meta
    return {}


def _tail_records(path: Path, problems: list[str]) -> list[dict[str, Any]]:
    """The records in the last ``TAIL_BYTES`` of a metrics JSONL (unreadable lines skipped)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not hang the listing
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not os.path.isfile(path) or info.st_size == 0:
                return []
            handle.seek(max(0, info.st_size - TAIL_BYTES))
            lines = handle.read(TAIL_BYTES).decode("utf-8", "replace").splitlines()
    except OSError as exc:
        problems.append(f"cannot read {path}: {exc.strerror or exc}")
        return []
    if info.st_size > TAIL_BYTES:
        lines = lines[1:]  # the first is cut
    # Parse only what a row uses: most lines are train_steps, and parsing them all is the cost
    speed = next((ln for ln in reversed(lines) if '"tokens_per_s"' in ln), None)
    step = next((ln for ln in reversed(lines) if '"train_step"' in ln), None)
    records = []
    wanted = (ln for ln in lines if ln is speed or ln is step or any(w in ln for w in _TAIL_WORDS))
    for line in wanted:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _status(root: Path, metrics: Path | None, tail: list[dict[str, Any]]) -> str:
    """How a run without a summary stands: its last ``run_end`` when no ``run_start`` came
    after it (a finished run from before summaries), else running or interrupted.

    ``train`` marks a run it trains (``RUNNING_FILE``, read first by ``read_run``); for a run
    from before that marker, "running" is read from traces a live run leaves: a checkpoint
    being written by a live process, or a metrics JSONL written in the last ``RECENT_S``
    seconds.
    """
    bounds = [r for r in tail if r.get("event") in ("run_start", "run_end")]
    if bounds and bounds[-1]["event"] == "run_end":
        return _END_STATUS.get(bounds[-1].get("status"), "interrupted")
    if any(_alive(parse_tmp_pid(d.name)) for d in list_tmp_dirs(root)):
        return "running"
    try:
        if metrics is not None and time.time() - metrics.stat().st_mtime < RECENT_S:
            return "running"
    except OSError:
        pass
    return "interrupted"


def _marker_status(path: Path) -> str | None:
    """``running`` while the process a run's marker names may live (``speedtronic.liveness``'s
    rule, shared with train and tokenize), ``interrupted`` once it is gone (killed with -9: it
    had no chance to remove the marker); None with no marker."""
    if not path.is_file():
        return None
    return "running" if marker_alive(path) else "interrupted"


def _alive(pid: int | None) -> bool:
    if pid is None or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, as someone else's
    return True


def _node(path: Path, config: dict[str, Any]) -> tuple[str | None, str | None]:
    """A DumbDiLoCo node's role and id from its stored config (a master that trains nothing
    may have no checkpoint: its state dir says what it is)."""
    if _get(config, "distributed.enabled") is True:
        return _text(_get(config, "distributed.role")), _text(_get(config, "distributed.node_id"))
    return ("master", None) if (path / MASTER_DIR).is_dir() else (None, None)


def _outer_step(path: Path, config: dict[str, Any], role: str | None, tail: list) -> int | None:
    """A master's newest saved outer step (its state manifests' names); a worker's, the
    newest its events name."""
    if role == "master":
        state = _get(config, "distributed.state_dir")
        chosen = Path(state).expanduser() if isinstance(state, str) and state else None
        # a relative state_dir was relative to where train ran: unknowable from here
        folder = chosen if chosen is not None and chosen.is_absolute() else path / MASTER_DIR
        steps = [int(m.group(1)) for n in _entries(folder) if (m := _MANIFEST.fullmatch(n))]
        return max(steps, default=None)
    if role == "worker":
        seen = [r["outer_step"] for r in tail if _count(r.get("outer_step")) is not None]
        return seen[-1] if seen else None
    return None


def _eval_sets(sets: object) -> dict[str, dict[str, float | None]]:
    """``{set: {"loss", "bits_per_byte"}}`` from a summary's ``eval`` or a meta's
    ``eval_sets``; anything malformed left out."""
    if not isinstance(sets, dict):
        return {}
    return {
        str(k): {"loss": finite(v.get("loss")), "bits_per_byte": finite(v.get("bits_per_byte"))}
        for k, v in sets.items()
        if isinstance(v, dict)
    }


def _loss_of(record: object) -> float | None:
    """meta.json's ``eval_loss``: ``{"step", "loss"}`` (a bare number in older ones)."""
    return finite(record.get("loss")) if isinstance(record, dict) else finite(record)


def _points(points: object, width: int) -> list[list[Any]]:
    """The well-formed ``[step, tokens, seconds, ...]`` points of a summary curve."""
    if not isinstance(points, list):
        return []
    return [p for p in points if isinstance(p, list) and len(p) == width]


def _get(config: object, dotted: str) -> Any:
    for part in dotted.split("."):
        config = config.get(part) if isinstance(config, dict) else None
    return config


def _least(values: list[float | None]) -> float | None:
    return min((v for v in values if v is not None), default=None)


def _count(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _first_word(label: object) -> str | None:
    """run_start's optimizer label ("muon (7 matrices, bf16) + adamw (fused)") -> "muon", the
    ``optimizer.name`` a checkpoint's config gives."""
    words = label.split() if isinstance(label, str) else []
    return words[0] if words else None

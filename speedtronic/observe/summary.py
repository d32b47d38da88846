"""The run's final summary: ``summary.json`` in its output directory, one per run (issue 49).

``RunRecord`` is a Trainer plug-in and a metrics hook: it keeps the loss curves (train and
eval points, bounded, thinned evenly as they grow) and the start time, and carries both in the
checkpoint so a resumed run's summary covers every part. ``build_summary`` gathers the figures
a script compares runs by (status, steps, tokens, the clock's training and start-up seconds,
throughput, eval loss and bits per byte per set, the config's hash and the keys that differ
from the defaults); ``write_summary`` stores it atomically as strict JSON. The fields are
docs/getting-started.md's ("Train for a time budget"); ``speedtronic runs`` reads them.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

from speedtronic.errors import SpeedtronicError
from speedtronic.observe.metrics import json_safe

SUMMARY_FILE = "summary.json"
SUMMARY_FORMAT = 1
CURVE_POINTS = 256  # points per curve in the summary
KEPT_POINTS = 2 * CURVE_POINTS  # kept while running: thinned to half when full
DATA_SET = "val"  # the eval set name of data.eval_every's held-out split


class RunRecord:
    """The curves and start time of a run, across resumes (plug-in ``record``, metrics hook)."""

    name = "record"

    def __init__(self, clock: Any):
        self.clock, self.trainer = clock, None
        self.started_at = now_iso()
        self.train: list[list[Any]] = []  # [step, tokens, train_s, loss]
        self.eval: list[list[Any]] = []  # [step, tokens, train_s, set, loss, bpb]

    def on_train_start(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        step = payload.get("step")
        if event == "train_step":
            point = [step, payload["tokens"], self.clock.at(step), payload["loss"]]
            _append(self.train, point)
        elif event in ("eval", "eval_set"):
            tokens = self.trainer.tokens if self.trainer is not None else None
            if event == "eval":  # data.eval_every's split: bits per byte where its bytes are known
                figures = [DATA_SET, payload["eval_loss"], payload.get("eval_bits_per_byte")]
            else:
                figures = [payload["set"], payload["loss"], payload["bits_per_byte"]]
            _append(self.eval, [step, tokens, self.clock.at(step), *figures])

    def state_dict(self) -> dict[str, Any]:
        return {"started_at": self.started_at, "train": self.train, "eval": self.eval}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.started_at = str(state.get("started_at") or self.started_at)
        self.train = [list(p) for p in state.get("train", [])]
        self.eval = [list(p) for p in state.get("eval", [])]

    def curve(self, trainer: Any, final_loss: float | None) -> dict[str, list]:
        """Both curves, at most ``CURVE_POINTS`` each, the run's last step included."""
        train = list(self.train)
        if trainer.step and (not train or train[-1][0] != trainer.step):
            train.append([trainer.step, trainer.tokens, self.clock.seconds, final_loss])
        return {"train": evenly(train, CURVE_POINTS), "eval": evenly(self.eval, CURVE_POINTS)}


def _append(points: list[list[Any]], point: list[Any]) -> None:
    points.append(point)
    if len(points) > KEPT_POINTS:  # odd: every other point keeps the first and the newest
        points[:] = points[::2]


def evenly(points: list[Any], most: int) -> list[Any]:
    """At most ``most`` of ``points``, evenly spaced, the first and last kept."""
    if len(points) <= most:
        return list(points)
    last = len(points) - 1
    return [points[round(i * last / (most - 1))] for i in range(most)]


def summarize_run(runtime: Any, result: Any = None, exc: BaseException | None = None) -> dict:
    """Build and store the summary of a run that returned ``result`` or raised ``exc``.

    Storing it never fails the run (``store_summary``). A second Ctrl-C (``KeyboardInterrupt``)
    is a stop, not a failure.
    """
    if exc is None:
        status, reason, error = *outcome(result, runtime.clock), None
    elif isinstance(exc, KeyboardInterrupt):
        status, reason, error = "stopped", "signal", None
    else:
        status, reason, error = "failed", "error", error_line(exc)
    build = partial(build_summary, runtime, status, reason, error)
    return store_summary(runtime.config.output_dir, build, runtime.logger)


def store_summary(directory: Path, build: Callable[[], dict], logger: Any) -> dict:
    """Build a summary and write it in ``directory``; a failure is warned, never raised: the
    run's checkpoints hold its work, and on the error path the run's own error matters more."""
    try:
        doc = build()
        write_summary(directory, doc)
    except Exception as failure:  # noqa: BLE001 (reported; the run's own outcome stands)
        logger.warn(f"summary.json: not written ({error_line(failure)})")
        return {}
    return doc


def error_line(exc: BaseException) -> str:
    """One line for an error: Speedtronic's own message, else the type and the first line."""
    text = (str(exc).strip().splitlines() or [""])[0][:500]
    if isinstance(exc, SpeedtronicError) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def outcome(result: Any, clock: Any) -> tuple[str, str]:
    """(status, stop_reason) of a run that returned: completed, or stopped by a signal."""
    if result.status == "interrupted":
        return "stopped", "signal"
    if result.status == "stopped":  # a plug-in asked (a DDP group's agreed stop, a DiLoCo end)
        return "stopped", "signal" if result.signal else "plugin"
    if clock.budget_reached:
        return "completed", "time_budget"
    return "completed", "target" if result.status == "at_target" else "max_steps"


def build_summary(runtime: Any, status: str, stop_reason: str, error: str | None) -> dict:
    """The summary document of ``runtime``'s run as it stands (see the module docstring)."""
    trainer, cfg, clock = runtime.trainer, runtime.config, runtime.clock
    final_loss = trainer.last_loss if error else trainer.current_loss()
    tokens_per_s = clock.tokens / clock.seconds if clock.seconds > 0 else None
    figures = {
        "status": status,
        "error": error,
        "stop_reason": stop_reason,
        "started_at": runtime.record.started_at,
        "steps": trainer.step,
        "tokens": trainer.tokens,
        "trained_tokens": trainer.trained_tokens,
        "train_s": clock.seconds,
        "startup_s": clock.startup_seconds(),
        "params": sum(p.numel() for p in runtime.model.parameters()),
        "tokens_per_s": tokens_per_s,
        "mfu": _mfu(trainer, tokens_per_s),
        "peak_memory_bytes": _peak_memory(trainer),
        "final_train_loss": final_loss,
        "eval": eval_figures(trainer.plugins),
        "tokenizer": _tokenizer(runtime),
        **_node(cfg, trainer.plugins),
        "curve": runtime.record.curve(trainer, final_loss),
    }
    return summary_doc(cfg, figures)


def summary_doc(cfg: Any, figures: dict[str, Any]) -> dict:
    """Every field of a summary, in the documented order: ``figures`` are the run's own (status
    and how it ended among them); a field it lacks is null (nothing trained, nothing measured)."""
    config = cfg.to_dict(redact=True)
    doc: dict[str, Any] = {
        "schema_version": SUMMARY_FORMAT,
        "name": cfg.run.name,
        **dict.fromkeys(("status", "error", "stop_reason", "started_at")),
        "ended_at": now_iso(),
        **dict.fromkeys(("steps", "tokens", "trained_tokens", "train_s", "startup_s")),
        "time_budget_s": cfg.run.time_budget_s,
        **dict.fromkeys(("params", "tokens_per_s", "mfu", "peak_memory_bytes")),
        "optimizer": cfg.optimizer.name,
        "final_train_loss": None,
        "eval": {},
        "config_sha256": config_sha256(config),
        "changed_keys": changed_keys(config, type(cfg)().to_dict(redact=True)),
        "config": config,
        **dict.fromkeys(("tokenizer", "role", "node_id", "outer_step")),
        "curve": {"train": [], "eval": []},
    }
    doc.update(figures)  # the fields keep their places
    return json_safe(doc)


def coordinator_summary(cfg: Any, done: dict[str, Any], exc: BaseException | None = None) -> dict:
    """The summary of a DumbDiLoCo master that only coordinates (``train_locally: false``): it
    trains nothing (0 steps), and its outer step says how far the run got. ``done`` holds its
    ``started_at`` and ``params``, and once it returned, ``outer_step`` and ``signal``."""
    if exc is not None and not isinstance(exc, KeyboardInterrupt):
        ended = {"status": "failed", "stop_reason": "error", "error": error_line(exc)}
    elif exc is not None or done.get("signal"):  # a second Ctrl-C is a stop too
        ended = {"status": "stopped", "stop_reason": "signal"}
    else:  # at outer_steps, or every node it heard from ended
        ended = {"status": "completed", "stop_reason": "outer_steps"}
    figures = {"started_at": done["started_at"], "steps": 0, "tokens": 0, "params": done["params"]}
    node = {"role": "master", "node_id": cfg.distributed.resolved_node_id}
    return summary_doc(cfg, {**ended, **figures, **node, "outer_step": done.get("outer_step")})


def eval_figures(plugins: list[Any]) -> dict[str, dict[str, Any]]:
    """The last loss and bits per byte of each eval set: ``eval.sets`` (scored from the text's
    bytes, as ``speedtronic eval`` does) and ``val``, data.eval_every's split (bits per byte for
    a text source or a token folder whose manifest records its bytes; else null)."""
    figures: dict[str, dict[str, Any]] = {}
    for plugin in plugins:
        last = getattr(plugin, "last", None)
        if getattr(plugin, "name", "") == "eval" and last is not None:
            bpb = getattr(plugin, "bits_per_byte", None)
            figures[DATA_SET] = {"loss": last[1], "bits_per_byte": bpb}
        elif getattr(plugin, "name", "") == "eval_sets":
            for name, sets in last.items():
                figures[name] = {"loss": sets["loss"], "bits_per_byte": sets["bits_per_byte"]}
    return figures


def config_sha256(config: dict[str, Any]) -> str:
    """The redacted config's hash: sorted keys, compact, so the same settings hash the same."""
    text = json.dumps(json_safe(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def changed_keys(config: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """Dotted keys whose value differs from the defaults' (or that the defaults lack)."""
    mine, theirs = _flat(config), _flat(defaults)
    return sorted(k for k in mine.keys() | theirs.keys() if mine.get(k, ...) != theirs.get(k, ...))


def _flat(section: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in section.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def write_summary(directory: Path, doc: dict[str, Any]) -> Path:
    """``directory/summary.json``, written to a temporary sibling, fsynced, then renamed: a
    reader sees the old file or the new, never half of one."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / SUMMARY_FILE
    text = json.dumps(json_safe(doc), indent=2, allow_nan=False) + "\n"
    tmp = directory / f".{SUMMARY_FILE}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with tmp.open("x", encoding="utf-8") as handle:  # the umask's mode, as any run file
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _mfu(trainer: Any, tokens_per_s: float | None) -> float | None:
    flops, peak = trainer.options.flops_per_token, trainer.step_log.peak
    if not (flops and peak and tokens_per_s):
        return None
    return flops * tokens_per_s / (peak * trainer.world)


def _peak_memory(trainer: Any) -> int | None:
    from speedtronic.train.step_log import memory_gb

    gigabytes = memory_gb(trainer.precision.device)
    return None if gigabytes is None else round(gigabytes * 1e9)


def _tokenizer(runtime: Any) -> dict[str, Any] | None:
    """The checkpoints' record of the run's tokenizer, without its (long) special tokens."""
    record = getattr(runtime.checkpoints, "tokenizer_meta", None)
    return {k: v for k, v in record.items() if k != "specials"} if record else None


def _node(cfg: Any, plugins: list[Any]) -> dict[str, Any]:
    """A DumbDiLoCo node's role, id and the global outer step it last built on."""
    if not cfg.distributed.enabled:
        return {"role": None, "node_id": None, "outer_step": None}
    steps = {getattr(p, "name", ""): p for p in plugins}
    if "diloco_master" in steps:  # the master's own count, also when it trains as a worker
        step = steps["diloco_master"].loop.master.outer_step
    elif "diloco" in steps:  # a worker: the global it trains from
        step = steps["diloco"].base_outer_step
    else:
        step = None
    role = cfg.distributed.role
    return {"role": role, "node_id": cfg.distributed.resolved_node_id, "outer_step": step}

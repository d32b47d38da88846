"""Metric hooks for TensorBoard and Weights & Biases (optional extra ``speedtronic[logging]``).

Enable with ``logging.hooks: [tensorboard]`` or ``[wandb]`` in YAML (or pass an instance in
``hooks=[...]``). A missing package is a ``ConfigError`` when the hook is built, before any
training; the package itself is imported only when the run starts.

What each event becomes (``TAGS``), on the step axis named in brackets:

- ``train_step`` -> ``train/loss``, ``train/lr``, ... [optimizer step]
- ``eval`` -> ``eval/loss``, ``eval/ppl`` [optimizer step]
- ``diloco_boundary`` -> ``diloco/outer_step`` (the global a node trains from), ``diloco/stall_s``,
  traffic counters [optimizer step]
- ``diloco_round`` -> ``diloco_round/included``, ``/stale``, ``/bad``, ``/tokens``, ``/momentum``
  [outer step]

TensorBoard takes the step axis as each scalar's step. W&B logs one row per event and names the
axes with ``define_metric`` (``train/step``, ``diloco_round/outer_step``), because its own
``_step`` must only grow and the master's rounds arrive from another thread on another axis.
Neither hook flushes per event: both hand the values to their package's background writer.
TensorBoard's writer reports a failed write (a full disk) at the next call; the hook turns it
into an ``OutputError`` naming ``logging.hooks`` and the directory, which the logger reports
as a failed hook and disables, as for any hook.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from speedtronic.errors import ConfigError, OutputError

INSTALL = "pip install 'speedtronic[logging]'"

_TRAIN = ("loss", "lr", "grad_norm", "tokens_per_s", "samples_per_s", "data_wait_share")
_BOUNDARY = ("outer_step", "stall_s", "uploads", "upload_failures", "bytes_up", "bytes_down")
# event -> (tag prefix, payload key of the step axis, {payload key: tag name})
TAGS: dict[str, tuple[str, str, dict[str, str]]] = {
    "train_step": ("train", "step", {k: k for k in (*_TRAIN, "mfu", "memory_gb")}),
    "eval": ("eval", "step", {"eval_loss": "loss", "eval_ppl": "ppl"}),
    "diloco_boundary": ("diloco", "step", {k: k for k in _BOUNDARY}),
    "diloco_round": (
        "diloco_round",
        "outer_step",
        {k: k for k in ("included", "stale", "bad", "tokens", "momentum")},
    ),
}


def scalars(event: str, payload: dict[str, Any]) -> tuple[int, dict[str, float]] | None:
    """``(step, {tag: value})`` for an event that carries scalars, else None."""
    if event == "eval_set" and payload.get("step") is not None:  # one tag group per set
        names = ("loss", "bits_per_byte")
        prefix = f"eval/{payload.get('set')}"
        return int(payload["step"]), {f"{prefix}/{k}": float(payload[k]) for k in names}
    spec = TAGS.get(event)
    if spec is None or payload.get(spec[1]) is None:
        return None
    prefix, axis, names = spec
    values = {
        f"{prefix}/{tag}": float(payload[key])
        for key, tag in names.items()
        if payload.get(key) is not None
    }
    return int(payload[axis]), values


class TensorBoardHook:
    """Event files under ``<output_dir>/tensorboard`` (or ``log_dir``)."""

    def __init__(self, log_dir: str | Path | None = None):
        require("tensorboard", "tensorboard", via="torch.utils.tensorboard")
        self.log_dir, self.writer = log_dir, None
        self.where: Path | None = None  # the event files' directory, once the run has started
        self._lock = threading.Lock()  # the DiLoCo master logs its rounds from its own thread

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        if event == "run_start":
            self.close()  # an instance reused for a second run starts a new event file
            self.where = Path(self.log_dir or Path(payload["output_dir"]) / "tensorboard")
            with self._io_errors_named():
                writer = _summary_writer(self.where)
            with self._lock:
                self.writer = writer
            # The writer's thread is a daemon: at exit it dies with the events still queued (and,
            # on remote file systems, all since its 2-minute flush), the steps before a crash.
            atexit.register(self._close_at_exit)
        elif event == "run_end":
            self.close()
        else:
            found = scalars(event, payload)
            with self._lock, self._io_errors_named():
                if found is None or self.writer is None:
                    return
                step, values = found
                for tag, value in values.items():
                    self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        with self._lock:
            writer, self.writer = self.writer, None
        if writer is not None:
            atexit.unregister(self._close_at_exit)
            with self._io_errors_named():
                writer.close()

    def _close_at_exit(self) -> None:
        try:
            self.close()
        except OutputError as exc:  # too late to stop anything: say which files lost events
            print(f"speedtronic: error: {exc}", file=sys.stderr)

    @contextlib.contextmanager
    def _io_errors_named(self) -> Iterator[None]:
        """An OSError of the writer (raised by the call after its thread failed) names the key
        and the directory: the OS's own message names neither. The writer is dropped: the
        logger disables the hook, and exit must not report the same failure again."""
        try:
            yield
        except OSError as exc:
            if self.writer is not None:
                self.writer = None
                atexit.unregister(self._close_at_exit)
            reason = exc.strerror or str(exc) or type(exc).__name__
            raise OutputError(
                f"logging.hooks: tensorboard: cannot write events in {self.where}: {reason}"
            ) from None


class WandbHook:
    """A W&B run named after ``run.name``, with the ``run_start`` facts as its config.

    ``project``: this, else $WANDB_PROJECT, else ``speedtronic``. Its files go to $WANDB_DIR,
    else ``<output_dir>/wandb``. A run the caller already started (a sweep agent's) is logged
    into and left for the caller to finish.
    """

    def __init__(self, project: str | None = None):
        require("wandb", "wandb")
        self.project, self.run, self.owned = project, None, False
        self._lock = threading.Lock()

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        if event == "run_start":
            self._start(payload)
        elif event == "run_end":
            self._finish(0 if payload.get("status") == "completed" else 1)
        else:
            found = scalars(event, payload)
            with self._lock:
                if found is None or self.run is None:
                    return
                step, values = found
                axis = "diloco_round/outer_step" if event == "diloco_round" else "train/step"
                self.run.log({axis: step, **values})

    def _start(self, payload: dict[str, Any]) -> None:
        global _last_own_run
        wandb = __import__("wandb")
        self._finish(1)  # an instance reused after a crash: its previous run ended badly
        active = getattr(wandb, "run", None)
        if active is not None and active is _last_own_run:
            active.finish(exit_code=1)  # another hook's run that crashed without run_end
            active = None
        if active is None:
            project = self.project or os.environ.get("WANDB_PROJECT") or "speedtronic"
            where = None if os.environ.get("WANDB_DIR") else payload.get("output_dir")
            run = wandb.init(project=project, name=payload["name"], config=payload, dir=where)
            _last_own_run = run
        else:
            run = active
        for axis, prefixes in _AXES.items():
            run.define_metric(axis)
            for prefix in prefixes:
                run.define_metric(f"{prefix}/*", step_metric=axis)
        with self._lock:
            self.run, self.owned = run, active is None

    def _finish(self, exit_code: int) -> None:
        global _last_own_run
        with self._lock:
            run, owned, self.run = self.run, self.owned, None
        if run is not None and owned:
            run.finish(exit_code=exit_code)
            if _last_own_run is run:
                _last_own_run = None


# W&B step metrics and the tag prefixes plotted against each
_AXES = {"train/step": ("train", "eval", "diloco"), "diloco_round/outer_step": ("diloco_round",)}
_last_own_run: Any = None  # the latest run a WandbHook started, until it finishes


def require(hook: str, package: str, via: str | None = None) -> None:
    """Raise the one-line ``ConfigError`` naming the extra when ``package`` is not installed.

    Only looks the package up (no import: wandb takes a second), so building hooks stays cheap.
    ``via``: the module the hook imports; already imported (or stood in for), it is enough.
    """
    if via is not None and sys.modules.get(via) is not None:
        return
    if package in sys.modules:  # None there: an import blocked on purpose
        found = sys.modules[package] is not None
    else:
        try:
            found = importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):
            found = False
    if not found:
        raise ConfigError(f"logging.hooks: {hook} needs the {package} package: {INSTALL}")


def _summary_writer(log_dir: Path) -> Any:
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(log_dir))

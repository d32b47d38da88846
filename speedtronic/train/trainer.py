"""The Trainer: one optimizer step at a time, as fast as a hand-written loop.

Owns gradient accumulation (the accumulated gradient equals the big-batch gradient, weighted
by non-ignored label counts), autocast and GradScaler, gradient clipping, opt-in
``torch.compile`` with an eager fallback, non-finite loss handling, clean stops on
SIGINT/SIGTERM, and the plug-in points (checkpoints, DiLoCo) through small hooks. The host
reads the loss back once per optimizer step (the finiteness check, also of the labels left to
learn from); the ``train_step`` metrics are ``step_log``'s, at its cadence.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from speedtronic.errors import TrainingError
from speedtronic.observe.metrics import MetricLogger
from speedtronic.train.clip import GradClip
from speedtronic.train.denormal import flushed_denormals
from speedtronic.train.failure import StepGuard
from speedtronic.train.precision import Precision
from speedtronic.train.rng import rng_state, set_rng_state
from speedtronic.train.step_log import StepLog, Window

IGNORE_INDEX = -100


@dataclass
class TrainResult:
    steps: int
    final_loss: float | None
    tokens: int
    samples: int
    elapsed_s: float
    status: str = "completed"  # "completed" | "interrupted" | "stopped" | "at_target"
    signal: int | None = None
    skipped_steps: int = 0
    checkpoint: str | None = None  # the last checkpoint written, if any
    tokens_per_s: float = 0.0  # over the steps trained by this call (not a resumed total)
    trained_tokens: int = 0  # labels learned from (not -100): fewer than tokens in an SFT run
    unsent: bool = False  # a DiLoCo node's deltas wait in its checkpoint: --resume sends them
    failure: str | None = None  # a DiLoCo node that took no part in its run: exit 1, this line
    summary: dict | None = None  # the run's summary.json document (observe/summary.py)


@dataclass
class TrainerOptions:
    max_steps: int
    accumulation_steps: int = 1
    grad_clip: float | None = 1.0
    log_every: int = 10
    compile: bool = False
    max_nonfinite: int = 5  # consecutive non-finite steps before stopping with an error
    flops_per_token: float | None = None
    handle_signals: bool = True
    flush_denormal: bool = True  # on CPU: subnormals flushed to zero during the loop


class Trainer:
    """Trains ``model`` on micro-batches from ``data`` until ``options.max_steps``.

    Plug-ins are objects with any of ``on_train_start(trainer)``,
    ``after_optimizer_step(trainer) -> "stop" | None``, ``on_train_end(trainer, result)``,
    ``on_stop(trainer, result)`` (a signal stopped the loop: before any ``on_train_end``, so
    that the checkpoint is written before anything waits), ``on_at_target(trainer, result)``
    (training was done already, e.g. ``--resume`` at max_steps), ``on_train_error(trainer,
    exc)`` (a step failed after others completed: ``train/failure.py``) and ``state_dict()`` /
    ``load_state_dict(state)`` (stored under their ``name``).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        data: Iterator[Any],
        precision: Precision,
        options: TrainerOptions,
        scheduler: Any = None,
        logger: MetricLogger | None = None,
        plugins: list[Any] | None = None,
    ):
        self.model, self.optimizer, self.data = model, optimizer, data
        self.precision, self.options, self.scheduler = precision, options, scheduler
        self.logger = logger or MetricLogger()
        self.plugins = list(plugins or [])
        self.scaler = precision.grad_scaler()
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.clip = GradClip(optimizer, self.scaler is not None, _on_gpu(precision.device))
        self.step = self.tokens = self.samples = self.trained_tokens = 0  # trained: not -100
        self.last_loss: float | None = None  # host copy, refreshed at the logging cadence
        self._loss: torch.Tensor | None = None  # the latest step's loss, still on the device
        self.skipped_steps = 0
        self._nonfinite_run = 0
        self._stop_signal: int | None = None
        self.signals = 0  # stop signals received: a second one ends any wait at once
        self.ending = False  # the loop is done: the plug-ins' end (saves, then waits) runs
        self._forward = _compiled(model, self.logger) if options.compile else model
        self._compiled_ok = False
        self.step_log = StepLog(self.logger, options, precision)
        # A DDP group's hooks (speedtronic.train.parallel); None in one process, which pays nothing.
        self.parallel: Any = None
        self.world = 1  # processes sharing each step: counters hold the global batch

    # ---- the loop --------------------------------------------------------------------
    def fit(self) -> TrainResult:
        start, start_tokens = time.perf_counter(), self.tokens
        self.model.train()
        if self.step >= self.options.max_steps:  # e.g. --resume of a finished run
            result = _train_result(self, start, start_tokens, "at_target")
            self.ending = True
            with self._signals():  # a plug-in may still finish (a DiLoCo node's end of run)
                self._call_plugins("on_at_target", self, result)
            return result
        self._call_plugins("on_train_start", self)
        status = "completed"
        flush = self.options.flush_denormal and self.precision.device.type == "cpu"
        with (
            self._signals() as guard,
            flushed_denormals(flush),
        ):  # also covers the final save: a first Ctrl-C waits
            with StepGuard(self) as steps:  # an error keeps the completed steps (train/failure.py)
                while status == "completed" and self.step < self.options.max_steps:
                    steps.begin()
                    loss, grad_norm = self.train_step(self.step_log.window)
                    steps.end()
                    status = self._after_step(loss, grad_norm, guard)
            result = _train_result(self, start, start_tokens, status)
            self.ending = True  # from now on a second signal cuts waits short, never a save
            if status == "interrupted":  # a stop is not an end: save first, wait after
                self._call_plugins("on_stop", self, result)
            self._call_plugins("on_train_end", self, result)
        return result

    def _after_step(self, loss: torch.Tensor, grad_norm: torch.Tensor, guard: Any) -> str:
        """Log at the cadence and run the plug-ins: the loop's status after this step."""
        if self.step_log.due(self.step):
            self.last_loss = self.step_log.emit(self, loss, grad_norm)
        status = "completed"
        if "stop" in self._call_plugins("after_optimizer_step", self):
            status = "stopped"
        if self._stop_signal is not None:
            guard.announce()
            status = "interrupted"
        return status

    def train_step(self, window: Window | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over ``accumulation_steps`` micro-batches; returns device tensors."""
        window = window or Window()
        micro = self._next_micro_batches(window)
        try:
            loss, grad_norm, labelled = self._forward_backward(micro)
        except Exception as exc:
            if self._forward is self.model or self._compiled_ok:
                raise
            self.logger.warn(
                f"torch.compile failed on the first step ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200]}); continuing eagerly"
            )
            self._forward = self.model
            self.optimizer.zero_grad(set_to_none=True)
            loss, grad_norm, labelled = self._forward_backward(micro)
        self._compiled_ok = True  # later failures are real errors, not compile trouble
        _tally(self, window, self._apply_update(loss, grad_norm, labelled), micro)
        self._loss = loss
        self.step += 1
        window.steps += 1
        return loss, grad_norm

    def _next_micro_batches(self, window: Window) -> list[Any]:
        micro = []
        for _ in range(self.options.accumulation_steps):
            t0 = time.perf_counter()
            batch = next(self.data)
            window.wait += time.perf_counter() - t0
            samples, tokens = batch_size_of(batch)
            _refuse_empty(self.step, tokens, labels_of(batch))
            samples, tokens = samples * self.world, tokens * self.world
            window.samples += samples
            window.tokens += tokens
            self.samples += samples
            self.tokens += tokens
            micro.append(batch)
        return micro

    def _forward_backward(self, micro: list[Any]) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Loss, gradient norm, and the count of labels to learn from (None: not countable)."""
        device, non_blocking = self.precision.device, self.precision.device.type == "cuda"
        micro = [move_to(b, device, non_blocking) for b in micro]
        counts, group = label_counts(micro), self.parallel
        weights = group.loss_weights(micro, counts) if group else loss_weights(micro, counts)
        total = torch.zeros((), device=device)
        for i, (batch, weight) in enumerate(zip(micro, weights, strict=True)):
            last = i == len(micro) - 1  # DDP: gradients sync on the last micro-step only
            with group.micro_step(last) if group else contextlib.nullcontext():
                with self.precision.autocast():
                    loss = extract_loss(call_model(self._forward, batch)).float() * weight
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            # a micro-batch with no label to learn (weight 0) may have a NaN mean loss: 0 here
            zero = torch.is_tensor(weight)  # a count-based weight: 0 for such a micro-batch
            total += torch.where(weight > 0, loss.detach(), 0.0) if zero else loss.detach()
        if group:
            total, counts = group.agree(total, counts)  # one loss and label count on all ranks
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        grad_norm = self.clip.clip(self.params, self.options.grad_clip)
        labelled = torch.stack(counts).sum() if counts is not None else None
        return total, grad_norm, labelled

    def _apply_update(self, loss: torch.Tensor, grad_norm: torch.Tensor, labelled: Any) -> Any:
        # The one host read per optimizer step (it returns the labels learned from): weights
        # must never see a non-finite update, nor one whose labels are all ignored (loss 0.0).
        loss_ok, norm_ok, count = _read_checks(loss, grad_norm, labelled)
        if count is not None and count <= 0:
            self.optimizer.zero_grad(set_to_none=True)  # no half-finished step left behind
            raise TrainingError(
                f"step {self.step + 1}: every label is {IGNORE_INDEX} (ignored), nothing to "
                "learn from; check the data source and its labels"
            )
        finite = loss_ok and (self.scaler or norm_ok)
        if finite:
            self._nonfinite_run = 0
            if self.scaler:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.clip.step()
        else:
            self._skip_nonfinite(loss)
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        return None if count is None else int(count)

    def _skip_nonfinite(self, loss: torch.Tensor) -> None:
        self.skipped_steps += 1
        self._nonfinite_run += 1
        if self.scaler:
            self.scaler.update()  # lowers the scale as after an overflow
        self.logger.warn(
            f"step {self.step + 1}: non-finite loss or gradient "
            f"(loss={float(loss):.4g}); update skipped"
        )
        if self._nonfinite_run >= self.options.max_nonfinite:
            raise TrainingError(
                f"{self._nonfinite_run} non-finite steps in a row at step {self.step + 1}; "
                "stopping before the weights are damaged",
                hint="lower optimizer.lr, enable optimizer.grad_clip or use precision.mode: bf16",
            )

    def current_loss(self) -> float | None:
        """The latest step's loss (reads it from the device)."""
        if self._loss is not None:
            self.last_loss = float(self._loss)
        return self.last_loss

    # ---- compile, plug-ins, signals, state -------------------------------------------
    def _call_plugins(self, method: str, *args: Any) -> list[Any]:
        return [getattr(p, method)(*args) for p in self.plugins if hasattr(p, method)]

    def _signals(self) -> Any:
        return _SignalGuard(self) if self.options.handle_signals else _NullGuard()

    @property
    def stop_signal(self) -> int | None:
        """The signal that asked the run to stop, if one did (plug-ins that wait check it)."""
        return self._stop_signal

    def request_stop(self, signum: int) -> None:
        """Finish the current optimizer step, then stop (what the first Ctrl-C does); a second
        call cuts the end's waits (``distributed/stopping.py``)."""
        if self._stop_signal is None:
            self._stop_signal = signum
        self.signals += 1

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue this run exactly (plain data and tensors)."""
        return {
            "step": self.step,
            "tokens": self.tokens,
            "trained_tokens": self.trained_tokens,
            "samples": self.samples,
            "last_loss": self.current_loss(),
            "skipped_steps": self.skipped_steps,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler else None,
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "data": self.data.state_dict() if hasattr(self.data, "state_dict") else None,
            "rng": rng_state(),
            "plugins": {p.name: p.state_dict() for p in self.plugins if hasattr(p, "state_dict")},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.tokens, self.samples = state["step"], state["tokens"], state["samples"]
        self.trained_tokens = state.get("trained_tokens", self.tokens)  # older: every label
        self.last_loss, self.skipped_steps = state["last_loss"], state["skipped_steps"]
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        if state["data"] is not None and hasattr(self.data, "load_state_dict"):
            self.data.load_state_dict(state["data"])
        set_rng_state(state["rng"])
        for plugin in self.plugins:
            if hasattr(plugin, "load_state_dict") and plugin.name in state["plugins"]:
                plugin.load_state_dict(state["plugins"][plugin.name])


def _refuse_empty(step: int, tokens: int, labels: Any) -> None:
    # From shapes on the host, no device read: an empty batch would train at loss 0.0.
    if tokens == 0 or (isinstance(labels, torch.Tensor) and labels.numel() == 0):
        raise TrainingError(f"step {step + 1}: the data yielded an empty micro-batch")


def _tally(trainer: Trainer, window: Window, count: int | None, micro: list[Any]) -> None:
    """Add a step's labels learned from (``count``: every rank's; None: not countable, so
    every token) to the run's and the log window's counts."""
    if count is None:
        count = sum(batch_size_of(b)[1] for b in micro) * trainer.world
    trainer.trained_tokens += count
    window.trained_tokens += count


def _train_result(trainer: Trainer, start: float, start_tokens: int, status: str) -> TrainResult:
    elapsed = time.perf_counter() - start
    return TrainResult(
        steps=trainer.step,
        final_loss=trainer.current_loss(),
        tokens=trainer.tokens,
        trained_tokens=trainer.trained_tokens,
        samples=trainer.samples,
        elapsed_s=elapsed,
        tokens_per_s=(trainer.tokens - start_tokens) / elapsed if elapsed > 0 else 0.0,
        status=status,
        signal=trainer.stop_signal,
        skipped_steps=trainer.skipped_steps,
    )


def _compiled(model: nn.Module, logger: MetricLogger) -> Any:
    try:
        return torch.compile(model)
    except Exception as exc:  # compile is opt-in speed, never a reason to fail
        logger.warn(f"torch.compile unavailable ({type(exc).__name__}: {exc}); continuing eagerly")
        return model


class _SignalGuard:
    """First SIGINT/SIGTERM: stop after this step. Second SIGINT: abort at once, while steps
    run; once the loop is done (the end saves, then waits), any second signal ends the waits.

    The handler only records the signal; the loop announces it once the step is done. A
    handler runs between two bytecodes of the main thread, which may hold the logger's lock:
    logging from it deadlocked (a SIGTERM during a JSONL write hung a run for good).
    """

    def __init__(self, trainer: Trainer):
        self.trainer, self.previous = trainer, {}
        self.caught: int | None = None
        self.announced = False

    def __enter__(self) -> _SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        trainer = self.trainer
        if trainer._stop_signal is not None and signum == signal.SIGINT and not trainer.ending:
            raise KeyboardInterrupt
        self.caught = self.caught or signum
        trainer.request_stop(signum)  # once ending: the waits end, the saves still complete

    def announce(self) -> None:
        """Say, once, which signal stops the run (from the loop, never from the handler)."""
        if self.caught is None or self.announced:
            return
        self.announced = True
        self.trainer.logger.notice(
            f"received {signal.Signals(self.caught).name}: stopping after step "
            f"{self.trainer.step} (press Ctrl-C again to abort at once)"
        )

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


class _NullGuard:
    def __enter__(self) -> _NullGuard:
        return self

    def announce(self) -> None:
        """A DDP group's agreed stop is announced by its own hooks (speedtronic.train.parallel)."""

    def __exit__(self, *exc: Any) -> None:
        return None


# ---- batch helpers (module level: also used by benchmarks and bench) ----------------------


def call_model(model: Any, batch: Any) -> Any:
    """Dict batches are keyword arguments, (inputs, labels) tuples positional, tensors alone."""
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def extract_loss(output: Any) -> torch.Tensor:
    if isinstance(output, dict) and "loss" in output:
        output = output["loss"]
    elif isinstance(output, (tuple, list)) and output:
        output = output[0]
    if not isinstance(output, torch.Tensor) or output.numel() != 1:
        raise TrainingError(
            "model forward must return a scalar loss tensor, a dict with 'loss', or a tuple "
            f"(loss, ...); got {type(output).__name__}"
        )
    return output.reshape(())


def _read_checks(loss: torch.Tensor, grad_norm: torch.Tensor, labelled: Any) -> tuple:
    """(loss finite, grad norm finite, labels to learn from or None) in a single device read."""
    device = loss.device  # everything stays on it until the one .tolist()
    count = labelled if labelled is not None else torch.full((), -1, device=device)
    checks = [torch.isfinite(loss), torch.isfinite(grad_norm), count]
    loss_ok, norm_ok, n = torch.stack([c.to(device, torch.int64) for c in checks]).tolist()
    return bool(loss_ok), bool(norm_ok), None if labelled is None else n


def labels_of(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, dict):
        return batch.get("labels")
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[1]
    return None


def label_counts(micro: list[Any]) -> list[torch.Tensor] | None:
    """Non-ignored labels per micro-batch, on the device; None without integer labels."""
    labels = [labels_of(b) for b in micro]
    if any(not isinstance(t, torch.Tensor) or t.is_floating_point() for t in labels):
        return None
    return [(t != IGNORE_INDEX).sum() for t in labels]


def loss_weights(micro: list[Any], counts: list[torch.Tensor] | None = None) -> list[Any]:
    """Weights so the sum of micro-batch mean losses equals the big-batch mean loss.

    With integer labels each micro-batch is weighted by its count of non-ignored labels
    (``label_counts``: computed on the device, no host sync); otherwise they weigh the same.
    """
    if len(micro) == 1:
        return [1.0]
    counts = counts if counts is not None else label_counts(micro)
    if counts is None:
        return [1.0 / len(micro)] * len(micro)
    total = torch.stack(counts).sum().clamp(min=1)
    return [c / total for c in counts]


def batch_size_of(batch: Any) -> tuple[int, int]:
    """(samples, tokens) of a batch, from shapes only: the first tensor's dims."""
    first = batch
    while isinstance(first, (dict, tuple, list)):
        first = next(iter(first.values())) if isinstance(first, dict) else first[0]
    if not isinstance(first, torch.Tensor) or first.dim() == 0:
        return 1, 1
    return first.shape[0], first.numel()


def move_to(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: move_to(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(move_to(v, device, non_blocking) for v in batch)
    return batch


def _on_gpu(device: torch.device) -> bool:
    return device.type in ("cuda", "mps")

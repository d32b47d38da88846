"""The ``train_step`` event: throughput, MFU and memory over the steps since the last line.

``StepLog`` owns the logging cadence (every ``log_every`` steps, the first and the last), the
counters of the window since the previous line (``Window``, filled by the Trainer as it draws
batches) and the device peak MFU is measured against. The host reads the loss only here, at
the cadence, never per micro-step.
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from speedtronic.observe.metrics import peak_flops


@dataclass
class Window:
    """Counters since the last log line."""

    start: float = field(default_factory=time.perf_counter)
    wait: float = 0.0
    tokens: int = 0
    trained_tokens: int = 0  # labels learned from (not -100)
    samples: int = 0
    steps: int = 0


class StepLog:
    """Emits one ``train_step`` event per logging interval and starts the next window."""

    def __init__(self, logger: Any, options: Any, precision: Any):
        self.logger, self.options, self.device = logger, options, precision.device
        self.window = Window()
        self.closed_wait = 0.0  # the data waits of the windows already logged
        self.peak = _peak_flops(precision)  # None: unknown (MFU unreported)

    def waited(self) -> float:
        """Seconds the loop has waited for data since the Trainer was built."""
        return self.closed_wait + self.window.wait

    def due(self, step: int) -> bool:
        every = self.options.log_every
        return step % every == 0 or step == self.options.max_steps or step == 1

    def emit(self, trainer: Any, loss: torch.Tensor, grad_norm: torch.Tensor) -> float:
        """Log the window that ends at ``trainer.step``; returns the loss read from the device."""
        window, self.window = self.window, Window()
        self.closed_wait += window.wait
        host_loss = float(loss)  # synchronises the device: metrics are exact
        elapsed = max(time.perf_counter() - window.start, 1e-9)
        tokens_per_s = window.tokens / elapsed
        flops, peak = self.options.flops_per_token, self.peak
        # tokens_per_s is the group's rate: divide by every rank's device peak
        mfu = flops * tokens_per_s / (peak * trainer.world) if (flops and peak) else None
        self.logger.log(
            "train_step",
            {
                "step": trainer.step,
                "max_steps": self.options.max_steps,
                "loss": host_loss,
                "lr": trainer.optimizer.param_groups[0]["lr"],
                "grad_norm": float(grad_norm),
                "steps_per_s": window.steps / elapsed,
                "samples_per_s": window.samples / elapsed,
                "tokens_per_s": tokens_per_s,
                "trained_tokens_per_s": window.trained_tokens / elapsed,
                "data_wait_share": min(1.0, window.wait / elapsed),
                "mfu": mfu,
                "memory_gb": memory_gb(self.device),
                "tokens": trainer.tokens,
                "trained_tokens": trainer.trained_tokens,
                "samples": trainer.samples,
                "skipped_steps": trainer.skipped_steps,
            },
        )
        return host_loss


def _peak_flops(precision: Any) -> float | None:
    """The device's vendor peak in the training dtype; None off CUDA (no table)."""
    device = precision.device
    if device.type != "cuda":
        return None
    return peak_flops(torch.cuda.get_device_name(device), precision.dtype is not None)


def memory_gb(device: torch.device) -> float | None:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    if device.type == "mps":
        return torch.mps.current_allocated_memory() / 1e9
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 1e9 if sys.platform == "darwin" else peak * 1024 / 1e9

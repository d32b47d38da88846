"""Metric hooks for TensorBoard and Weights & Biases (optional extra ``speedtronic[logging]``).

Enable with ``logging.hooks: [tensorboard]`` or ``[wandb]`` in YAML (or pass an instance in
``hooks=[...]``). Each opens its writer at ``run_start`` and logs ``train_step`` and ``eval``
scalars by optimizer step. Their packages are imported only when a run starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from speedtronic.errors import ConfigError

SCALARS = (
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "samples_per_s",
    "data_wait_share",
    "mfu",
    "memory_gb",
    "eval_loss",
    "eval_ppl",
)


def scalars(payload: dict[str, Any]) -> dict[str, float]:
    return {k: float(payload[k]) for k in SCALARS if payload.get(k) is not None}


class TensorBoardHook:
    """Event files under ``<output_dir>/tensorboard`` (or ``log_dir``)."""

    def __init__(self, log_dir: str | Path | None = None):
        self.log_dir, self.writer = log_dir, None

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        if event == "run_start":
            self.writer = _summary_writer(
                self.log_dir or Path(payload["output_dir"]) / "tensorboard"
            )
        elif event in ("train_step", "eval") and self.writer is not None:
            for key, value in scalars(payload).items():
                self.writer.add_scalar(
                    f"{'eval' if event == 'eval' else 'train'}/{key}", value, payload["step"]
                )
        elif event == "run_end" and self.writer is not None:
            self.writer.close()
            self.writer = None


class WandbHook:
    """A W&B run named after ``run.name``; ``project`` defaults to $WANDB_PROJECT or speedtronic."""

    def __init__(self, project: str | None = None):
        self.project, self.run = project, None

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        if event == "run_start":
            wandb = _import("wandb")
            self.run = wandb.init(project=self.project, name=payload["name"], config=payload)
        elif event in ("train_step", "eval") and self.run is not None:
            prefix = "eval" if event == "eval" else "train"
            self.run.log(
                {f"{prefix}/{k}": v for k, v in scalars(payload).items()}, step=payload["step"]
            )
        elif event == "run_end" and self.run is not None:
            self.run.finish()
            self.run = None


def _summary_writer(log_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            "logging.hooks: tensorboard needs the 'tensorboard' package",
            hint="pip install 'speedtronic[logging]'",
        ) from None
    return SummaryWriter(log_dir=str(log_dir))


def _import(name: str) -> Any:
    try:
        return __import__(name)
    except ImportError:
        raise ConfigError(
            f"logging.hooks: {name} needs the {name!r} package",
            hint="pip install 'speedtronic[logging]'",
        ) from None

"""Speedtronic: a fast, reliable PyTorch training framework.

Public API: ``SpeedtronicConfig``, ``register_model``, ``MetricLogger`` (importing them does
not import torch), and lazily ``train_from_config`` / ``build_runtime``.
"""

from typing import Any

from speedtronic.config import SpeedtronicConfig
from speedtronic.errors import ConfigError, SpeedtronicError
from speedtronic.metrics import MetricLogger
from speedtronic.registry import register_model

__version__ = "0.1.0"
__all__ = [
    "ConfigError",
    "MetricLogger",
    "SpeedtronicConfig",
    "SpeedtronicError",
    "build_runtime",
    "register_model",
    "train_from_config",
]


def __getattr__(name: str) -> Any:
    if name in ("train_from_config", "build_runtime"):
        from speedtronic import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'speedtronic' has no attribute {name!r}")

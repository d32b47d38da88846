"""Speedtronic: a fast, reliable PyTorch training framework.

Public API: ``SpeedtronicConfig``, ``register_model``, ``MetricLogger`` (importing them does
not import torch), and ``train_from_config`` / ``build_runtime`` (which do). Every name loads
on first use: ``speedtronic --help`` and shell completion import this package at every TAB, and
must not pay for the config loader, YAML or torch that only a command's body needs.
"""

from speedtronic.errors import ConfigError, SpeedtronicError
from speedtronic.lazy import lazy_exports
from speedtronic.moved import install as _answer_moved_paths

__version__ = "0.1.0"
_EXPORTS = {
    "MetricLogger": "observe.metrics",
    "SpeedtronicConfig": "config",
    "build_runtime": "runtime",
    "register_model": "registry",
    "train_from_config": "runtime",
}
__all__ = ["ConfigError", "SpeedtronicError", *sorted(_EXPORTS)]

__getattr__ = lazy_exports(__name__, _EXPORTS)
_answer_moved_paths()  # issue 41's old module paths, for one release

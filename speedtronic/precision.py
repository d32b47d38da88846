"""Device and numeric precision: which device, which autocast dtype, whether to scale grads.

Rules: ``auto`` uses bf16 where CUDA supports it, fp16 + GradScaler on other CUDA, fp32 on
CPU and MPS. Explicit modes are honoured unless the hardware cannot run them; then fp32 with a
warning. bf16 autocast on CPU is a supported explicit mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from speedtronic.errors import ConfigError


@dataclass(frozen=True)
class Precision:
    device: torch.device
    mode: str  # resolved: "bf16" | "fp16" | "fp32"
    dtype: torch.dtype | None  # autocast dtype, None for fp32

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def grad_scaler(self) -> object | None:
        if self.mode != "fp16" or self.device.type != "cuda":
            return None
        scaler_cls = getattr(torch.amp, "GradScaler", None)  # torch < 2.3 has only the cuda one
        return scaler_cls("cuda") if scaler_cls else torch.cuda.amp.GradScaler()


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda, then mps, then cpu. An explicit device that is missing is a ConfigError."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"run.device: {name!r} is not available on this machine (no CUDA GPU visible "
                "to torch); use 'auto' or 'cpu'"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"run.device: {name!r} does not exist; this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)"
            )
    if device.type == "mps" and not _mps_available():
        raise ConfigError("run.device: 'mps' is not available on this machine; use 'auto' or 'cpu'")
    return device


def resolve_precision(mode: str, device: torch.device, warn: Callable[[str], None]) -> Precision:
    if mode == "auto":
        if device.type == "cuda":
            mode = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        else:
            mode = "fp32"
    elif mode == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        warn("precision.mode: bf16 is not supported by this GPU; falling back to fp32")
        mode = "fp32"
    elif mode == "fp16" and device.type == "cpu":
        warn("precision.mode: fp16 autocast is not supported on CPU; falling back to fp32")
        mode = "fp32"
    elif mode != "fp32" and device.type == "mps" and not _mps_autocast_ok(mode):
        warn(f"precision.mode: {mode} autocast is not supported on this MPS build; using fp32")
        mode = "fp32"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
    return Precision(device=device, mode=mode, dtype=dtype)


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend and backend.is_available())


def _mps_autocast_ok(mode: str) -> bool:
    try:
        with torch.autocast("mps", dtype=torch.bfloat16 if mode == "bf16" else torch.float16):
            return True
    except (RuntimeError, ValueError):
        return False

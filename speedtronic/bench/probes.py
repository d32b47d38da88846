"""Device probes: facts about the device and its physical limits, and how they are timed.

This module owns the timing primitives (device synchronisation around every clock read,
warmed-up repeated blocks with their CPU share), the device facts (name, memory, bf16/fp16/TF32
support, CPU ISA flags), the precision modes and matmul dtypes worth measuring, the peak
square-matmul throughput per dtype, memory copy bandwidth, the vendor peak table lookup, and
peak-memory bookkeeping. Nothing here knows about models or the Trainer.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from speedtronic.observe.metrics import peak_flops
from speedtronic.train.emulation import cpu_info
from speedtronic.train.precision import resolve_precision, synchronize
from speedtronic.train.step_log import memory_gb

MODES = ("fp32", "bf16", "fp16")
PEAK_REPEATS = 5  # timed blocks per matmul dtype and for the copy; the peak is the best one

# ---- timing primitives ------------------------------------------------------------------


def timed(work: Callable[[], Any], device: torch.device) -> float:
    """Wall seconds of ``work()``, the device synchronised before both clock reads."""
    synchronize(device)
    start = time.perf_counter()
    work()
    synchronize(device)
    return time.perf_counter() - start


def repeat_timed(
    step: Callable[[], Any], device: torch.device, seconds: float, repeats: int
) -> tuple[int, list[float], float | None]:
    """Warm ``step`` up, then time ``repeats`` blocks of ``n`` calls that fill ``seconds``.

    Returns ``(n, block_seconds, cpu_share)``. The warm-up doubles its call count until it
    has run for a third of ``seconds`` (the first heavy second of a process can run slow),
    which also estimates the time per call. On CPU,
    ``cpu_share`` (process CPU time / (wall time * torch threads) over the timed blocks) well
    under 1 means another process had the cores meanwhile; None on other devices.
    """
    step()  # first call: kernel selection, allocations, lazy initialisation
    calls, spent = 1, 0.0
    while spent < max(seconds / 3, 1e-3):
        spent = timed(lambda c=calls: [step() for _ in range(c)], device)
        per_call = spent / calls
        calls *= 2
    n = max(1, round(seconds / repeats / max(per_call, 1e-9)))
    cpu = time.process_time()
    blocks = [timed(lambda: [step() for _ in range(n)], device) for _ in range(repeats)]
    share = (time.process_time() - cpu) / (sum(blocks) * torch.get_num_threads())
    return n, blocks, share if device.type == "cpu" else None


# ---- device facts -----------------------------------------------------------------------

_ISA_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
)


def cpu_flags() -> set[str]:
    """CPU feature flags from /proc/cpuinfo (Linux: x86 ``flags``, Arm ``Features``)."""
    return cpu_info()[1]


def cpu_name() -> str:
    return cpu_info()[0] or "cpu"


def device_facts(device: torch.device) -> dict[str, Any]:
    """Name, backend, memory and capability flags of ``device``."""
    flags = cpu_flags()
    isa = [f for f in _ISA_FLAGS if f in flags]
    get_capability = getattr(torch.backends.cpu, "get_cpu_capability", None)
    caps: dict[str, Any] = {
        # CPU: hardware bf16/fp16 arithmetic; without it autocast runs but is emulated.
        "bf16": bool({"avx512_bf16", "amx_bf16", "bf16"} & flags),
        "fp16": bool({"avx512_fp16", "amx_fp16", "fphp"} & flags),
        "tf32": False,
        "isa": isa,
        "cpu_capability": get_capability() if get_capability else None,
        "compute_capability": None,
    }
    facts: dict[str, Any] = {
        "name": cpu_name(),
        "backend": device.type,
        "index": device.index,
        "memory_gb": _host_memory_gb(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "capabilities": caps,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts.update(name=props.name, index=device.index or 0, memory_gb=props.total_memory / 1e9)
        caps.update(
            bf16=torch.cuda.is_bf16_supported(),
            fp16=True,
            tf32=props.major >= 8,
            compute_capability=f"{props.major}.{props.minor}",
        )
    elif device.type == "mps":
        facts["name"] = f"Apple MPS ({platform.machine()})"
        caps.update(bf16="bf16" in supported_modes(device), fp16=True)
    return facts


def _host_memory_gb() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return None


def supported_modes(device: torch.device) -> list[str]:
    """Precision modes that train on ``device`` as asked, without a fallback to fp32."""
    modes = []
    for mode in MODES:
        warnings: list[str] = []
        if resolve_precision(mode, device, warnings.append).mode == mode:
            modes.append(mode)
    return modes


def matmul_dtypes(device: torch.device, caps: dict[str, Any]) -> list[str]:
    """The matmul dtypes worth a peak: the trainable ones, plus TF32 where the GPU has it."""
    dtypes = ["fp32"] + (["tf32"] if caps["tf32"] else [])
    if device.type == "cpu":  # bf16 always trains on CPU (emulated without the ISA)
        return dtypes + ["bf16"] + (["fp16"] if caps["fp16"] else [])
    return dtypes + [m for m in supported_modes(device) if m != "fp32"]


# ---- physical limits --------------------------------------------------------------------

_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}
_DTYPES["fp16"] = torch.float16


@contextlib.contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def measure_matmul(
    name: str, size: int, device: torch.device, seconds: float, repeats: int
) -> dict[str, Any]:
    """Peak throughput of ``size`` x ``size`` matmuls in dtype ``name`` (fp32/tf32/bf16/fp16).

    ``tflops`` is the best of ``repeats`` timed blocks (the peak), ``tflops_median`` their
    median. Outputs go to a preallocated tensor, so allocation is never timed.
    """
    matmul = _matmul(name, size, device)
    with _tf32_if_asked(name, device):
        n, blocks, share = repeat_timed(matmul, device, seconds, repeats)
    flops = 2.0 * size**3 * n
    return {
        "tflops": flops / min(blocks) / 1e12,
        "tflops_median": flops / statistics.median(blocks) / 1e12,
        "size": size,
        "iterations": n * repeats,
        "seconds": sum(blocks),
        "cpu_share": share,
    }


def time_matmul_call(
    name: str, size: int, device: torch.device, give_up_s: float = math.inf
) -> float:
    """Wall seconds of one ``size`` x ``size`` matmul in dtype ``name``.

    The best of a warm-up call (kernel selection, oneDNN code generation) and one or two more:
    two when calls are short, as a busy machine can stall any single one by milliseconds. A
    warm-up slower than ``give_up_s`` is returned alone: the caller will not use that size.
    """
    matmul = _matmul(name, size, device)
    with _tf32_if_asked(name, device):
        calls = [timed(matmul, device)]
        if calls[0] > give_up_s:
            return calls[0]
        calls.append(timed(matmul, device))
        if calls[-1] < 0.01:
            calls.append(timed(matmul, device))
        return min(calls)


def _matmul(name: str, size: int, device: torch.device) -> Callable[[], Any]:
    """One square matmul into a preallocated output, so allocation is never timed."""
    a = torch.randn(size, size, device=device).to(_DTYPES[name])
    b = torch.randn(size, size, device=device).to(_DTYPES[name])
    out = torch.empty_like(a)
    return lambda: torch.mm(a, b, out=out)


def _tf32_if_asked(name: str, device: torch.device) -> contextlib.AbstractContextManager:
    return _tf32(name == "tf32") if device.type == "cuda" else contextlib.nullcontext()


def measure_copy(mib: int, device: torch.device, seconds: float, repeats: int) -> dict[str, Any]:
    """Device memory bandwidth of a large tensor copy, counting bytes read plus written."""
    src = torch.ones(mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    n, blocks, share = repeat_timed(lambda: dst.copy_(src), device, seconds, repeats)
    moved = 2.0 * src.numel() * src.element_size() * n
    return {
        "gb_per_s": moved / min(blocks) / 1e9,
        "gb_per_s_median": moved / statistics.median(blocks) / 1e9,
        "bytes": src.numel() * src.element_size(),
        "iterations": n * repeats,
        "seconds": sum(blocks),
        "cpu_share": share,
    }


def vendor_tflops(facts: dict[str, Any]) -> dict[str, float | None]:
    """The vendor table's dense peaks for this device (``metrics.PEAK_TFLOPS``); None off-GPU."""
    if facts["backend"] != "cuda":
        return {"fp32": None, "low_precision": None}
    full, low = peak_flops(facts["name"], False), peak_flops(facts["name"], True)
    return {
        "fp32": full / 1e12 if full else None,
        "low_precision": low / 1e12 if low else None,
    }


# ---- memory -----------------------------------------------------------------------------


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: the CUDA allocator's, or the process's peak RSS on Linux."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    elif device.type == "cpu":
        with contextlib.suppress(OSError):  # "5" resets VmHWM to the current RSS (Linux >= 4.0)
            Path("/proc/self/clear_refs").write_text("5", encoding="ascii")


def peak_memory_gb(device: torch.device) -> float | None:
    """Peak since ``reset_peak_memory``: CUDA allocator, else process RSS (as ``train`` shows)."""
    if device.type == "cpu":
        with contextlib.suppress(OSError, ValueError):
            for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 1e9
    return memory_gb(device)

"""Device and numeric precision: which device, which autocast dtype, whether to scale grads.

Rules: ``auto`` uses bf16 where CUDA supports it, fp16 + GradScaler on other CUDA, fp32 on
CPU and MPS. Explicit modes are honoured unless the hardware cannot run them; then fp32 with a
warning. bf16 autocast on CPU is a supported explicit mode, but a CPU without bf16 arithmetic
(e.g. AVX2 only) emulates it, tens to hundreds of times slower than fp32: the machine's one
verdict (``emulation.verdict``, cached on disk) says so, and ``emulation_warning`` turns it into
one line for the start of a command. A time-boxed probe (``probe_matmul``, a few ms, cached per
device and dtype) sizes bench's stages; it never decides emulation.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from speedtronic.errors import ConfigError
from speedtronic.train import emulation


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


# ---- emulation probe ----------------------------------------------------------------------

# A low-precision matmul at least this many times slower than fp32 is emulated in software
# (native bf16 is faster than fp32, or at worst a little slower at probe sizes).
EMULATION_FACTOR = 4.0
PROBE_SIZES = (64, 128, 256)  # tiny on purpose: the probe must cost milliseconds anywhere
PROBE_CALL_S = 0.004  # grow the probe only while one matmul is predicted to take less
PROBE_BUDGET_S = 0.02  # per dtype; a call already running is finished, then the probe stops
_PROBE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_PROBES: dict[tuple[str, int | None, str, int | None], MatmulProbe] = {}


@dataclass(frozen=True)
class MatmulProbe:
    """The speed of one small square matmul in one precision mode on one device."""

    mode: str
    size: int  # the largest probe size that fitted the time box
    seconds: float  # the best timed call (the warm-up call when the box allowed no other)

    @property
    def gflops(self) -> float:
        return 2.0 * self.size**3 / self.seconds / 1e9


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so the next clock read includes it (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def probe_matmul(device: torch.device, mode: str, size: int | None = None) -> MatmulProbe:
    """Time small ``mode`` matmuls on ``device``, growing the size while calls stay cheap.

    With ``size`` only that size is timed (to compare two modes at the same size). Cached per
    device, mode and size for the life of the process. Time-boxed: a size is tried only when
    the previous one predicts (n^3 scaling) a call under ``PROBE_CALL_S``, and the probe stops
    once ``PROBE_BUDGET_S`` has passed, so even a 1000x emulated dtype costs tens of ms.
    """
    key = (device.type, device.index, mode, size)
    if key not in _PROBES:
        _PROBES[key] = _measure_probe(device, mode, (size,) if size else PROBE_SIZES)
    return _PROBES[key]


def _measure_probe(device: torch.device, mode: str, sizes: tuple[int, ...]) -> MatmulProbe:
    dtype = _PROBE_DTYPES[mode]
    with _one_cpu_thread(device):
        # The first call initialises the math library (cuBLAS handle, oneDNN kernels).
        _time_matmul(device, dtype, 8, deadline=0.0)
        deadline = time.perf_counter() + PROBE_BUDGET_S
        best: MatmulProbe | None = None
        for size in sizes:
            if best is not None and best.seconds * (size / best.size) ** 3 > PROBE_CALL_S:
                break
            best = MatmulProbe(mode, size, _time_matmul(device, dtype, size, deadline))
            if time.perf_counter() > deadline:
                break
    assert best is not None  # sizes is never empty
    return best


@contextlib.contextmanager
def _one_cpu_thread(device: torch.device) -> Iterator[None]:
    """On CPU, run the probe on the calling thread alone and time it in thread CPU time.

    With several threads, a tiny parallel matmul on a shared machine waits for a scheduler
    time slice (4-16 ms) whenever another process holds a core: measured 16 ms for a 64x64
    fp32 matmul that takes 10 us. One thread's CPU time is immune to that, and emulation is a
    property of each core, so the fp32/low-precision ratio stays what it is.
    """
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _time_matmul(device: torch.device, dtype: torch.dtype, size: int, deadline: float) -> float:
    """The best of 2-3 timed calls after a warm-up call (which builds the kernel for the shape).

    Past ``deadline`` a size still gets its 2 timed calls: the warm-up can take milliseconds
    of kernel generation, and timing the warm-up alone would read a native dtype as emulated.
    Only a warm-up slower than the whole budget is returned as it is.
    """
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    out = torch.empty_like(a)
    clock = time.thread_time if device.type == "cpu" else time.perf_counter
    calls: list[float] = []
    while len(calls) < 3 or (len(calls) < 4 and time.perf_counter() < deadline):
        synchronize(device)
        start = clock()
        torch.mm(a, b, out=out)
        synchronize(device)
        calls.append(clock() - start)
        if calls[0] > PROBE_BUDGET_S:
            break
    return min(calls[1:]) if len(calls) > 1 else calls[0]


def matmul_slowdown(device: torch.device, mode: str) -> tuple[float, MatmulProbe]:
    """How many times slower ``mode``'s probe matmul is than fp32's of the same size."""
    low = probe_matmul(device, mode)
    base = probe_matmul(device, "fp32", low.size)
    return low.seconds / base.seconds, low


def emulation_warning(device: torch.device, mode: str) -> str | None:
    """One line when ``mode`` (bf16/fp16) is emulated on this CPU; None when it is not.

    Only CPUs are judged: a GPU that lacks a mode is already refused by ``resolve_precision``.
    The verdict is this machine's one (``emulation.verdict``: the CPU's flags, else a load-robust
    timing, cached on disk), so bench, validate, train and generate never disagree.
    """
    if device.type != "cpu" or mode not in ("bf16", "fp16"):
        return None
    try:
        found = emulation.verdict(mode)
    except RuntimeError:  # an old build without this CPU kernel: resolve_precision's concern
        return None
    if not found.emulated:
        return None
    return (
        f"precision.mode: {mode} is emulated on this CPU: {found.reason()}; "
        "set precision.mode: fp32 unless you need these numerics"
    )

"""Whether this CPU runs bf16/fp16 matmuls natively: one verdict per machine, made once, cached.

This module owns the verdict every command shares (bench, validate, train, generate, eval),
how it is made and where it is kept. Why: a timing probe alone read a native AVX512-BF16 CPU
as "5x slower than fp32" at load 12 and as native a minute later (issue 40), so a user was told
to switch to fp32 for nothing. Rules, in order:

1. The CPU's flags decide where they can: ``avx512_bf16``/``amx_bf16`` (Arm: ``bf16``) present
   means native, absent means emulated. They cannot decide when there are none to read (no
   ``/proc/cpuinfo``), when torch has no oneDNN (its bf16 matmuls are then generic code), or
   when ``ONEDNN_MAX_CPU_ISA``/``DNNL_MAX_CPU_ISA`` caps the math library below the flags.
2. Otherwise a load-robust timing decides: bf16 and fp32 matmuls interleaved, several rounds on
   one thread in thread CPU time, the best of each compared, against a generous factor.
3. The verdict is written to ``<user cache dir>/speedtronic/machine/`` (or
   ``$SPEEDTRONIC_MACHINE_CACHE``), keyed by what identifies the machine's CPU and torch build
   (CPU model, flags, torch version and CPU kernel level, oneDNN, the ISA caps above), and read
   back by every later process: nothing re-decides it until that file is deleted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

CPUINFO = Path("/proc/cpuinfo")
CACHE_ENV = "SPEEDTRONIC_MACHINE_CACHE"
NATIVE_FLAGS = {"bf16": ("avx512_bf16", "amx_bf16", "bf16"), "fp16": ("avx512_fp16", "amx_fp16")}
ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")  # env that can hide the flags from oneDNN
TIMING_FACTOR = 8.0  # emulation measured 25-400x; native read at most 5x under load (issue 40)
TIMING_SIZE = 128
TIMING_ROUNDS = 7
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_VERDICTS: dict[str, Verdict] = {}


@dataclass(frozen=True)
class Verdict:
    """Whether ``mode`` is emulated here, on what basis, and what the timing read if it ran."""

    mode: str
    emulated: bool
    basis: str  # "cpu flags" | "timing"
    slowdown: float | None = None  # mode / fp32 matmul time; timing only
    size: int | None = None  # the timed matmul's side; timing only
    cache: str | None = None  # the file the verdict was read from or written to

    def reason(self) -> str:
        """Why, in words, for one warning or bench line."""
        if self.basis == "cpu flags":
            names = " or ".join(NATIVE_FLAGS[self.mode][:2])
            return f"its flags list {'no ' if self.emulated else ''}{names}"
        side = f"{self.size}x{self.size}"
        return f"its matmuls run {self.slowdown:.0f}x slower than fp32 (a {side} probe)"


def cpu_info() -> tuple[str, set[str]]:
    """The CPU's model name and flags (x86 ``flags``, Arm ``Features``); no flags if unknown."""
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or platform.machine(), set()
    name, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "CPU part") and not name:
            name = value.strip()
        elif key.strip() in ("flags", "Features") and not flags:
            flags = set(value.split())
    return name or platform.machine(), flags


def machine_key(mode: str) -> str:
    """What the verdict depends on, hashed: CPU model and flags, torch build, ISA caps, mode."""
    name, flags = cpu_info()
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: None)()
    parts = [mode, name, sorted(flags), torch.__version__, capability, _onednn()]
    parts += [os.environ.get(var, "") for var in ISA_CAPS]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def cache_path(mode: str) -> Path:
    """``$SPEEDTRONIC_MACHINE_CACHE`` (tests, or a shared home) else the user cache dir."""
    from platformdirs import user_cache_dir

    root = os.environ.get(CACHE_ENV) or Path(user_cache_dir("speedtronic"), "machine")
    return Path(root, f"{mode}-{machine_key(mode)}.json")


def verdict(mode: str) -> Verdict:
    """This machine's verdict on ``mode``: from this process, else the cache file, else made now."""
    path = cache_path(mode)
    if str(path) not in _VERDICTS:
        found = _read(path, mode) or _write(path, decide(mode))
        _VERDICTS[str(path)] = found
    return _VERDICTS[str(path)]


def decide(mode: str) -> Verdict:
    """Flags where they decide (rule 1), else the load-robust timing (rule 2). Never cached here."""
    _, flags = cpu_info()
    if flags and _onednn() and not any(os.environ.get(var) for var in ISA_CAPS):
        return Verdict(mode, not set(NATIVE_FLAGS[mode]) & flags, "cpu flags")
    slowdown = timed_slowdown(mode)
    return Verdict(mode, slowdown >= TIMING_FACTOR, "timing", slowdown, TIMING_SIZE)


def timed_slowdown(mode: str, size: int = TIMING_SIZE, rounds: int = TIMING_ROUNDS) -> float:
    """Best ``mode`` matmul time over best fp32 time, the two interleaved round by round.

    Interleaving gives both dtypes the same spells of load, and the best of several rounds is
    what each costs when nothing interferes; one thread and its CPU time as in the bench probe.
    """
    calls = {m: _matmul(m, size) for m in (mode, "fp32")}
    best = {m: float("inf") for m in calls}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for call in calls.values():
            call()  # kernel generation and first-touch, never timed
        for _ in range(rounds):
            for m, call in calls.items():
                start = time.thread_time()
                call()
                best[m] = min(best[m], time.thread_time() - start)
    finally:
        torch.set_num_threads(threads)
    return best[mode] / max(best["fp32"], 1e-9)


def _matmul(mode: str, size: int):
    a = torch.randn(size, size).to(_DTYPES[mode])
    b = torch.randn(size, size).to(_DTYPES[mode])
    out = torch.empty_like(a)
    return lambda: torch.mm(a, b, out=out)


def _onednn() -> bool:
    backend = getattr(torch.backends, "mkldnn", None)
    return bool(backend and backend.is_available())


def _read(path: Path, mode: str) -> Verdict | None:
    """The cached verdict, or None when there is none or it is not one (then it is remade)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        found = Verdict(**{**data, "cache": str(path)})
    except (OSError, ValueError, TypeError):
        return None
    ok = found.mode == mode and isinstance(found.emulated, bool)
    return found if ok and found.basis in ("cpu flags", "timing") else None


def _write(path: Path, found: Verdict) -> Verdict:
    """Keep ``found`` for later processes; the first writer wins, so two processes deciding at
    once still end with one verdict. An unwritable cache only costs a re-decision later."""
    data = {k: v for k, v in asdict(found).items() if k != "cache"}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.link(tmp, path)  # atomic, and refused when another process got there first
    except FileExistsError:
        kept = _read(path, found.mode)
        if kept is not None:
            return kept
        with contextlib.suppress(OSError):  # a damaged file: replaced, or kept out of the way
            os.replace(tmp, path)
    except OSError:
        return found
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return Verdict(**{**data, "cache": str(path)})

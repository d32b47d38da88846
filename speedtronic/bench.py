"""Device and engine measurements behind ``speedtronic bench``, and the raw-loop baseline.

This module owns what ``bench`` measures and how: device facts (name, memory, bf16/fp16/TF32
support, CPU ISA), the physical limits (peak square-matmul throughput per dtype, memory copy
bandwidth), the configured model's optimizer step through the real ``Trainer`` in every
precision mode the device supports (tokens/s, step time, MFU against the measured peak and
the vendor table, peak memory), the engine's overhead against a minimal hand-written PyTorch
loop (``RawLoop``, shared with ``benchmarks/overhead.py``), data loader throughput against the
model's consumption, checkpoint save/load bandwidth, and ``torch.compile`` on/off. Warm-up is
never timed and the device is synchronised before every clock read. ``run_bench`` returns one
JSON-ready document (``SCHEMA_VERSION``; keys documented in ``docs/benchmarks.md``);
``verdicts`` turns a document into one short judgement per line. Progress is reported as
``(event, payload)`` pairs; rendering belongs to the CLI.
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from speedtronic.checkpoint import load_checkpoint, save_checkpoint
from speedtronic.config import SpeedtronicConfig
from speedtronic.data import DataStream, build_dataloader
from speedtronic.errors import ConfigError, TrainingError
from speedtronic.metrics import peak_flops
from speedtronic.optim import build_optimizer, build_scheduler
from speedtronic.precision import resolve_device, resolve_precision
from speedtronic.registry import build_model
from speedtronic.runtime import Runtime, build_runtime, count_parameters, seed_everything
from speedtronic.trainer import batch_size_of, extract_loss, memory_gb

SCHEMA_VERSION = 1
Progress = Callable[[str, dict[str, Any]], None]
MODES = ("fp32", "bf16", "fp16")
PEAK_REPEATS = 5  # timed blocks per matmul dtype and for the copy; the peak is the best one
# A timed round in which a side had less of the CPU than this (CPU time / (wall * threads))
# shared the cores with another process; such rounds are left out of the "clean" ratio.
IDLE_SHARE = 0.97
# Verdict thresholds.
WORTH_SWITCHING = 1.10  # a precision mode or compile this much faster is worth a config change
HEADROOM_OK = 2.0  # data loader this many times faster than the model consumes: fine
OVERHEAD_OK = 0.97  # Trainer / raw loop at or above this is within the noise (~+-3%)
OVERHEAD_WARN = 0.90
CONTENDED = 0.90  # CPU share below this: another process disturbed the measurement
CHECKPOINT_COST_WARN = 0.05  # saves costing more than this share of training time


@dataclass
class BenchOptions:
    """How long and how big. ``None`` picks the default for the device and mode (quick/full)."""

    quick: bool = False
    matmul_size: int | None = None  # square matmul side; default 2048 CPU, 8192 CUDA, 4096 MPS
    copy_mib: int | None = None  # memory copy buffer; default 256 CPU, 1024 GPU
    min_time_s: float | None = None  # each timed measurement (one model round, one matmul
    # dtype, the copy, the loader) runs at least this long; default 0.7 quick, 2.0 full
    rounds: int | None = None  # timed rounds per model side; default 5 (quick rounds are shorter)
    scratch_dir: str | None = None  # where the checkpoint is written (default: system temp)

    @property
    def seconds(self) -> float:
        if self.min_time_s is not None:
            return self.min_time_s
        return 0.7 if self.quick else 2.0

    @property
    def timed_rounds(self) -> int:
        return self.rounds or 5

    @property
    def warmup_steps(self) -> int:
        """Untimed steps after the first one; they also estimate the step time."""
        return 2 if self.quick else 3


# ---- timing primitives ------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so the next clock read includes it (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


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
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine() or "cpu"


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
    a = torch.randn(size, size, device=device).to(_DTYPES[name])
    b = torch.randn(size, size, device=device).to(_DTYPES[name])
    out = torch.empty_like(a)
    with _tf32(name == "tf32") if device.type == "cuda" else contextlib.nullcontext():
        n, blocks, share = repeat_timed(lambda: torch.mm(a, b, out=out), device, seconds, repeats)
    flops = 2.0 * size**3 * n
    return {
        "tflops": flops / min(blocks) / 1e12,
        "tflops_median": flops / statistics.median(blocks) / 1e12,
        "size": size,
        "iterations": n * repeats,
        "seconds": sum(blocks),
        "cpu_share": share,
    }


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


# ---- the raw loop baseline (shared with benchmarks/overhead.py) -------------------------


def endless(loader: Any) -> Iterator[Any]:
    """Epoch after epoch, as a hand-written loop would do."""
    while True:
        yield from loader


@dataclass
class RawLoop:
    """The loop a competent user writes by hand, with the Trainer's model/optimizer recipe."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    batches: Iterator[dict[str, torch.Tensor]]
    device: torch.device
    dtype: torch.dtype | None  # autocast dtype, None for fp32
    accumulation: int
    clip: float | None
    log_every: int
    step: int = 0
    last_loss: float | None = field(default=None)

    def optimizer_step(self) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        for _ in range(self.accumulation):
            batch = {k: v.to(self.device, non_blocking=True) for k, v in next(self.batches).items()}
            autocast = torch.autocast(self.device.type, dtype=self.dtype) if self.dtype else None
            with autocast or contextlib.nullcontext():
                # No label is -100 in SyntheticTokens, so 1/accumulation is exactly the
                # Trainer's per-micro-batch weight (count / total count). extract_loss: a
                # model may return a tensor, {"loss": ...} or (loss, ...).
                loss = extract_loss(self.model(**batch)) / self.accumulation
            loss.backward()
            total += loss.detach()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return total

    def run(self, steps: int) -> None:
        """``steps`` optimizer steps; the loss is read back only at the logging cadence."""
        for i in range(steps):
            loss = self.optimizer_step()
            self.step += 1
            if self.step % self.log_every == 0 or i == steps - 1:
                self.last_loss = loss.item()


def build_raw(
    config: SpeedtronicConfig, runtime: Runtime, fingerprint: list[float] | None = None
) -> RawLoop:
    """A second, independent model/optimizer/scheduler/data built exactly like the runtime's.

    Its initial weights must equal the runtime model's, or, when the Trainer has already
    stepped, ``fingerprint`` (``weights_fingerprint`` of the runtime model at initialisation).
    """
    seed_everything(config.run.seed)
    model = build_model(config.model.name, config.model.params, config.model.imports)
    model.to(runtime.precision.device).train()
    optimizer, kernel = build_optimizer(model, config.optimizer, runtime.logger.warn)
    if kernel != runtime.optimizer_kernel:
        raise TrainingError(
            f"optimizer kernel differs: raw {kernel}, trainer {runtime.optimizer_kernel}"
        )
    if fingerprint is None:
        check_same_weights(model, runtime.model)
    elif weights_fingerprint(model) != fingerprint:
        raise TrainingError("the two models differ at initialisation; the comparison is unfair")
    return RawLoop(
        model=model,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, config.scheduler, config.schedule_steps),
        batches=endless(build_dataloader(config, device=runtime.precision.device)),
        device=runtime.precision.device,
        dtype=runtime.precision.dtype,
        accumulation=config.accumulation_steps,
        clip=config.optimizer.grad_clip,
        log_every=config.logging.every_steps,
    )


def check_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    if sa.keys() != sb.keys() or any(not torch.equal(sa[k], sb[k]) for k in sa):
        raise TrainingError("the two models differ at initialisation; the comparison is unfair")


def weights_fingerprint(model: torch.nn.Module) -> list[float]:
    """Per-tensor float64 sums: equal weights give equal lists, and it costs no weight copy."""
    return [float(t.detach().double().sum()) for t in model.state_dict().values()]


def drop_checkpoints(runtime: Runtime) -> None:
    """Detach the run's checkpoint plug-in: the raw loop does not save either.

    With ``checkpoint.interval: 0`` it saves once, when ``fit()`` returns, which would charge a
    full save to every timed round; saving is measured on its own.
    """
    plugin = getattr(runtime, "checkpoints", None)
    if plugin is not None and plugin in runtime.trainer.plugins:
        runtime.trainer.plugins.remove(plugin)


def run_trainer(runtime: Runtime, steps: int) -> None:
    """``steps`` optimizer steps through ``Trainer.fit()``.

    ``fit()`` rather than a ``train_step()`` loop: it is what a user runs, and it adds what
    ``train_step`` alone would leave out (the log-cadence check, the metrics read-back and
    payload at log steps, the plug-in and stop-signal checks). Raising ``max_steps`` by
    ``steps`` makes ``fit()`` continue from where it stopped; its once-per-call set-up
    (``model.train()``, signal handlers, one log line at the round's last step, like the raw
    loop's read) is O(1) per round and is counted.
    """
    trainer = runtime.trainer
    trainer.options.max_steps = trainer.step + steps
    result = trainer.fit()
    if result.status != "completed" or trainer.step != trainer.options.max_steps:
        raise TrainingError(f"trainer stopped early: {result.status} at step {trainer.step}")


@dataclass
class Timings:
    """Per side ("trainer", "raw"), per timed round: wall-clock and process CPU seconds."""

    tokens: int  # tokens per round
    threads: int  # torch intra-op threads
    on_cpu: bool  # CPU shares say something about contention only when the CPU does the work
    wall: dict[str, list[float]] = field(default_factory=lambda: {"trainer": [], "raw": []})
    cpu: dict[str, list[float]] = field(default_factory=lambda: {"trainer": [], "raw": []})

    def time(self, side: str, work: Callable[[], None], device: torch.device) -> None:
        synchronize(device)
        wall, cpu = time.perf_counter(), time.process_time()
        work()
        synchronize(device)
        self.wall[side].append(time.perf_counter() - wall)
        self.cpu[side].append(time.process_time() - cpu)

    def rates(self, side: str) -> list[float]:
        return [self.tokens / wall for wall in self.wall[side]]

    def shares(self, side: str) -> list[float]:
        """CPU time / (wall * threads): well under 1 means another process had the cores."""
        pairs = zip(self.cpu[side], self.wall[side], strict=True)
        return [cpu / (wall * self.threads) for cpu, wall in pairs]

    def line(self, label: str) -> str:
        sides = (
            f"{s} {self.rates(s)[-1]:,.0f} tok/s (cpu {self.shares(s)[-1]:.0%})"
            for s in self.wall
            if self.wall[s]
        )
        return f"  {label} round {len(self.wall['trainer'])}: " + "  ".join(sides)


def alternate(
    runtime: Runtime,
    raw: RawLoop | None,
    warmup: int,
    steps: int,
    rounds: int,
    report: Callable[[str], None] | None = None,
) -> Timings:
    """Warm both sides up, then time ``rounds`` rounds of each, in ABBA order.

    The order flips every round, so slow drift of the machine hits both sides alike. With
    ``raw=None`` only the Trainer is timed.
    """
    if warmup:
        run_trainer(runtime, warmup)
        if raw is not None:
            raw.run(warmup)
    device = runtime.precision.device
    sides = {"trainer": lambda: run_trainer(runtime, steps)}
    if raw is not None:
        sides["raw"] = lambda: raw.run(steps)
    tokens = steps * runtime.config.tokens_per_step
    timings = Timings(tokens, torch.get_num_threads(), device.type == "cpu")
    label = f"{runtime.config.run.name}/{runtime.precision.mode}"
    for r in range(rounds):
        for side in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            timings.time(side, sides[side], device)
        if report is not None:
            report(timings.line(label))
    return timings


def ratio_stats(t: Timings) -> dict[str, Any]:
    """Per-round ratios trainer/raw: of tokens/s, of CPU time, and over the rounds with the CPU."""
    ratios = [r / w for w, r in zip(t.wall["trainer"], t.wall["raw"], strict=True)]
    cpu_ratios = [r / c for c, r in zip(t.cpu["trainer"], t.cpu["raw"], strict=True)]
    shares = zip(t.shares("trainer"), t.shares("raw"), strict=True)
    idle = [not t.on_cpu or min(pair) >= IDLE_SHARE for pair in shares]
    clean = [q for q, ok in zip(ratios, idle, strict=True) if ok]
    return {
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "clean_rounds": len(clean),
        "ratio_clean": statistics.median(clean) if clean else None,
        "ratio_cpu_time": statistics.median(cpu_ratios),
        "round_ratios": ratios,
        "round_trainer_tokens_per_s": t.rates("trainer"),
        "round_raw_tokens_per_s": t.rates("raw"),
        "round_trainer_cpu_share": t.shares("trainer"),
        "round_raw_cpu_share": t.shares("raw"),
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


# ---- the run ----------------------------------------------------------------------------


class _Events:
    """A MetricLogger hook that keeps train_step payloads and warnings of one runtime."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.warnings: list[str] = []

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        if event == "train_step":
            self.steps.append(payload)
        elif event == "warning":
            self.warnings.append(str(payload.get("message")))


def run_bench(
    config: Any, options: BenchOptions | None = None, progress: Progress | None = None
) -> dict[str, Any]:
    """Measure everything for ``config`` (object, dict, path or YAML) on its ``run.device``."""
    return Bench(SpeedtronicConfig.load(config), options or BenchOptions(), progress).run()


class Bench:
    """One bench run: stages in order, each adding its section to ``self.doc``."""

    def __init__(self, config: SpeedtronicConfig, options: BenchOptions, progress: Progress | None):
        self.config, self.options = config, options
        self.progress = progress or (lambda event, payload: None)
        self.device = resolve_device(config.run.device)
        self.facts = device_facts(self.device)
        self.configured = resolve_precision(config.precision.mode, self.device, self._warn).mode
        self.modes = [self.configured] + [
            m for m in supported_modes(self.device) if m != self.configured
        ]
        self.dtypes = matmul_dtypes(self.device, self.facts["capabilities"])
        self.doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "quick": options.quick}
        self._warned: set[str] = set()
        self._stage_index = 0
        self._stages = len(self.dtypes) + len(self.modes) + 4 + int(config.compile)
        self.scratch = Path(tempfile.gettempdir())

    # ---- driver ------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        start = time.perf_counter()
        where = self.options.scratch_dir
        if where is not None and not Path(where).is_dir():
            raise ConfigError(f"--scratch-dir: {where} is not an existing directory")
        self.scratch = Path(
            tempfile.mkdtemp(prefix="speedtronic-bench-", dir=self.options.scratch_dir)
        )
        try:
            # Training first: the matmul and copy stages free 16-256 MB buffers, which raises
            # glibc's mmap/trim thresholds and would make later CPU steps faster than in a
            # `speedtronic train` process (measured: up to ~15% on the smoke model).
            self._stage("device facts", self._device_stage)
            self._model_stages()
            self.doc["compile"] = self._compile_section()
            self.doc["data"] = self._stage("data loader", self._data)
            self.doc["peaks"] = self._peaks()
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)
        self._add_mfu()
        self.doc["elapsed_s"] = time.perf_counter() - start
        self.doc["verdicts"] = verdicts(self.doc)
        return self._ordered()

    def _ordered(self) -> dict[str, Any]:
        keys = ("schema_version", "quick", "elapsed_s", "config", "device", "peaks", "model")
        keys += ("overhead", "data", "checkpoint", "compile", "verdicts")
        return json_safe({key: self.doc[key] for key in keys})

    def _stage(self, label: str, work: Callable[[], Any]) -> Any:
        self._stage_index += 1
        where = {"index": self._stage_index, "total": self._stages, "label": label}
        self.progress("stage_start", where)
        start = time.perf_counter()
        result = work()
        self.progress("stage_end", {**where, "seconds": time.perf_counter() - start})
        return result

    def _warn(self, message: str) -> None:
        if message not in self._warned:  # every runtime build repeats its warnings
            self._warned.add(message)
            self.progress("warning", {"message": message})

    # ---- stages ------------------------------------------------------------------------
    def _device_stage(self) -> None:
        self.doc["device"] = self.facts

    def _matmul_size(self) -> int:
        default = {"cuda": 8192, "mps": 4096}.get(self.device.type, 2048)
        return self.options.matmul_size or default

    def _matmul(self, name: str) -> dict[str, Any]:
        size, seconds = self._matmul_size(), self.options.seconds
        return measure_matmul(name, size, self.device, seconds, PEAK_REPEATS)

    def _copy(self) -> dict[str, Any]:
        mib = self.options.copy_mib or (256 if self.device.type == "cpu" else 1024)
        return measure_copy(mib, self.device, self.options.seconds, PEAK_REPEATS)

    def _peaks(self) -> dict[str, Any]:
        peaks: dict[str, Any] = {"matmul": dict.fromkeys(("fp32", "tf32", "bf16", "fp16"))}
        for name in self.dtypes:
            label = f"matmul {name} {self._matmul_size()}x{self._matmul_size()}"
            peaks["matmul"][name] = self._stage(label, lambda n=name: self._matmul(n))
        peaks["memory_copy"] = self._stage("memory copy", self._copy)
        peaks["vendor_tflops"] = vendor_tflops(self.facts)
        return peaks

    # ---- the model, through the Trainer ------------------------------------------------
    def _model_stages(self) -> None:
        modes: dict[str, Any] = {}
        self.doc["model"] = {"configured": self.configured, "modes": modes}
        runtime = None
        for mode in self.modes:
            first = mode == self.configured  # measured first, against the raw loop
            label = f"model {mode}" + (" + raw PyTorch loop" if first else "")
            runtime = None  # free the previous mode's model and optimizer first
            run = self._stage(label, lambda m=mode, f=first: self._measure_mode(m, with_raw=f))
            modes[mode] = run.row
            if first:
                self.doc["config"] = self._config_facts(run.runtime)
                self.doc["overhead"] = run.overhead
            runtime, run = run.runtime, None
        # The saved state (fp32 weights, AdamW moments) is the same in every precision mode.
        work = lambda: self._checkpoint(runtime)  # noqa: E731
        self.doc["checkpoint"] = self._stage("checkpoint save/load", work)
        base = modes[self.configured]["tokens_per_s"]
        for row in modes.values():
            row["speedup_vs_configured"] = row["tokens_per_s"] / base

    def _add_mfu(self) -> None:
        """MFU of every mode, once the peaks are measured (they are timed last)."""
        flops = self.doc["config"]["flops_per_token"]
        for mode, row in self.doc["model"]["modes"].items():
            measured = self._measured_peak(mode)
            vendor_key = "fp32" if mode == "fp32" else "low_precision"
            vendor = self.doc["peaks"]["vendor_tflops"][vendor_key]
            tokens_per_s = row["tokens_per_s"]
            row["mfu_measured_peak"] = flops * tokens_per_s / measured if measured else None
            row["mfu_vendor_peak"] = flops * tokens_per_s / (vendor * 1e12) if vendor else None

    def _runtime(self, mode: str, events: _Events, compile: bool = False) -> Runtime:
        """The configured run in ``mode``: no log files, hooks, checkpoints or DiLoCo."""
        raw = self.config.to_dict(redact=False)
        raw["run"].update(device=str(self.device), output_dir=str(self.scratch / "run"))
        raw["precision"] = {"mode": mode}
        raw["compile"] = compile
        raw["logging"].update(file=None, json_file=None, hooks=[])
        raw["data"]["eval_every"] = 0  # evaluation is not training throughput
        raw["checkpoint"].update(interval=0, resume=False, directory=str(self.scratch / "ckpt"))
        raw["distributed"]["enabled"] = False
        runtime = build_runtime(SpeedtronicConfig.from_dict(raw), console=False, hooks=[events])
        drop_checkpoints(runtime)
        runtime.trainer.options.handle_signals = False  # Ctrl-C ends the bench at once: 130
        return runtime

    def _measure_mode(self, mode: str, with_raw: bool, compile: bool = False) -> _ModeRun:
        """Warm up (untimed), then time rounds of Trainer steps (alternated with the raw loop)."""
        events = _Events()
        reset_peak_memory(self.device)
        runtime = self._runtime(mode, events, compile)
        # The raw loop is built after the Trainer's warm-up, so it is not in its peak memory.
        initial = weights_fingerprint(runtime.model) if with_raw else None
        first_s = timed(lambda: run_trainer(runtime, 1), self.device)
        warm = self.options.warmup_steps
        step_s = timed(lambda: run_trainer(runtime, warm), self.device) / warm
        memory = peak_memory_gb(self.device)
        steps = min(10_000, max(1, round(self.options.seconds / step_s)))
        raw = None
        if with_raw:
            raw = build_raw(runtime.config, runtime, fingerprint=initial)
            raw.run(1 + warm)  # the same warm-up as the Trainer had
        events.steps.clear()
        timings = alternate(runtime, raw, 0, steps, self.options.timed_rounds)
        for message in events.warnings:
            self._warn(message)
        row = self._row(mode, runtime, timings, memory, events)
        overhead = self._overhead(mode, timings, steps) if raw is not None else None
        return _ModeRun(runtime, row, overhead, first_s, events)

    def _measured_peak(self, mode: str) -> float | None:
        name = mode
        if mode == "fp32" and self.device.type == "cuda" and _tf32_enabled():
            name = "tf32"
        peak = self.doc["peaks"]["matmul"].get(name)
        return peak["tflops"] * 1e12 if peak else None

    def _row(
        self, mode: str, runtime: Runtime, timings: Timings, memory: float | None, events: _Events
    ) -> dict[str, Any]:
        tokens_per_s = statistics.median(timings.rates("trainer"))
        waits = [s["data_wait_share"] for s in events.steps if "data_wait_share" in s]
        shares = timings.shares("trainer")
        return {
            "precision": mode,
            "tokens_per_s": tokens_per_s,
            "step_time_s": runtime.config.tokens_per_step / tokens_per_s,
            "steps": timings.tokens // runtime.config.tokens_per_step * len(shares),
            "mfu_measured_peak": None,  # filled in by _add_mfu
            "mfu_vendor_peak": None,
            "peak_memory_gb": memory,
            "data_wait_share": statistics.median(waits) if waits else None,
            "cpu_share": statistics.median(shares) if timings.on_cpu else None,
            "speedup_vs_configured": 1.0,
            "final_loss": runtime.trainer.last_loss,
        }

    def _overhead(self, mode: str, timings: Timings, steps: int) -> dict[str, Any]:
        stats = ratio_stats(timings)
        return {
            "precision": mode,
            "trainer_tokens_per_s": statistics.median(timings.rates("trainer")),
            "raw_tokens_per_s": statistics.median(timings.rates("raw")),
            "ratio": stats["ratio"],
            "ratio_min": stats["ratio_min"],
            "ratio_max": stats["ratio_max"],
            "ratio_clean": stats["ratio_clean"],
            "clean_rounds": stats["clean_rounds"],
            "rounds": len(stats["round_ratios"]),
            "steps_per_round": steps,
        }

    def _config_facts(self, runtime: Runtime) -> dict[str, Any]:
        cfg = runtime.config
        return {
            "name": cfg.run.name,
            "model": cfg.model.name,
            "params": count_parameters(runtime.model),
            "flops_per_token": runtime.trainer.options.flops_per_token,
            "tokens_per_step": cfg.tokens_per_step,
            "micro_batch_size": cfg.data.micro_batch_size,
            "accumulation_steps": cfg.accumulation_steps,
            "seq_len": cfg.seq_len,
            "precision": self.configured,
            "compile": self.config.compile,
            "optimizer": runtime.optimizer_kernel,
        }

    # ---- checkpoint, compile, data ----------------------------------------------------
    def _checkpoint(self, runtime: Runtime) -> dict[str, Any]:
        """Save (state_dict collection included, as a run's save) and load, to a scratch dir."""
        trainer, model, root = runtime.trainer, runtime.model, self.scratch / "checkpoints"
        meta = {
            "run_id": "bench",
            "tokens": trainer.tokens,
            "samples": trainer.samples,
            "loss": trainer.current_loss(),
            "param_count": count_parameters(model),
            "config": runtime.config.to_dict(redact=True),
        }
        saves, loads, paths = [], [], []
        for _ in range(2 if self.options.quick else 3):
            shutil.rmtree(root, ignore_errors=True)  # every save starts from the same state

            def save() -> None:
                state = trainer.state_dict()
                paths.append(save_checkpoint(root, trainer.step, model.state_dict(), state, meta))

            saves.append(timed(save, self.device))
            loads.append(timed(lambda: load_checkpoint(paths[-1]), self.device))
        size = sum(f.stat().st_size for f in paths[-1].iterdir() if f.is_file())
        save_s, load_s = statistics.median(saves), statistics.median(loads)
        return {
            "bytes": size,
            "save_s": save_s,
            "load_s": load_s,
            "save_gb_per_s": size / save_s / 1e9,
            "load_gb_per_s": size / load_s / 1e9,
            "repeats": len(saves),
            "interval": self.config.checkpoint.interval,
            "directory": str(self.scratch.parent),
        }

    def _compile_section(self) -> dict[str, Any]:
        keys = ("precision", "first_step_s", "compile_s", "eager_tokens_per_s")
        keys += ("compiled_tokens_per_s", "speedup", "fell_back", "message")
        section: dict[str, Any] = {"enabled": self.config.compile, **dict.fromkeys(keys)}
        if not self.config.compile:
            return section
        mode = self.configured
        work = lambda: self._measure_mode(mode, with_raw=False, compile=True)  # noqa: E731
        run = self._stage(f"model {mode} with torch.compile", work)
        eager = self.doc["model"]["modes"][mode]
        failed = [w for w in run.events.warnings if "torch.compile" in w]
        section.update(
            precision=mode,
            first_step_s=run.first_s,
            compile_s=max(0.0, run.first_s - eager["step_time_s"]),
            eager_tokens_per_s=eager["tokens_per_s"],
            compiled_tokens_per_s=run.row["tokens_per_s"],
            speedup=run.row["tokens_per_s"] / eager["tokens_per_s"],
            fell_back=bool(failed),
            message=failed[0] if failed else None,
        )
        return section

    def _data(self) -> dict[str, Any]:
        """The configured loader alone, read as fast as possible, against the model's rate."""
        loader = build_dataloader(self.config, device=self.device)
        pinned = bool(getattr(loader, "pin_memory", False))
        stream = DataStream(loader, log=self._warn)
        first_s = timed(stream.__next__, torch.device("cpu"))  # worker start-up included
        batches = tokens = samples = 0
        start = time.perf_counter()
        while (elapsed := time.perf_counter() - start) < self.options.seconds or batches < 2:
            n_samples, n_tokens = batch_size_of(next(stream))
            batches, tokens, samples = batches + 1, tokens + n_tokens, samples + n_samples
        del stream, loader  # stops loader workers, if any
        consumed = self._consumption()
        return {
            "source": self.config.data.resolved_source,
            "num_workers": self.config.data.num_workers,
            "pin_memory": pinned,
            "batches": batches,
            "tokens_per_s": tokens / elapsed,
            "samples_per_s": samples / elapsed,
            "first_batch_s": first_s,
            "consumption_tokens_per_s": consumed,
            "headroom": tokens / elapsed / consumed,
            "data_wait_share": self.doc["model"]["modes"][self.configured]["data_wait_share"],
        }

    def _consumption(self) -> float:
        """Tokens/s the configured run consumes: compiled when compile is on and works."""
        compiled = self.doc["compile"]
        if compiled["enabled"] and not compiled["fell_back"]:
            return compiled["compiled_tokens_per_s"]
        return self.doc["model"]["modes"][self.configured]["tokens_per_s"]


@dataclass
class _ModeRun:
    runtime: Runtime
    row: dict[str, Any]
    overhead: dict[str, Any] | None
    first_s: float  # the first optimizer step, compilation included when compile is on
    events: _Events


def _tf32_enabled() -> bool:
    """Whether fp32 matmuls in training run as TF32 (the user may have allowed it)."""
    precision = torch.get_float32_matmul_precision()
    return bool(torch.backends.cuda.matmul.allow_tf32) or precision != "highest"


def json_safe(value: Any) -> Any:
    """Non-finite floats become None, so the document is strict JSON."""
    if isinstance(value, float) and not (value == value and abs(value) != float("inf")):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


# ---- verdicts -----------------------------------------------------------------------------


def verdicts(doc: dict[str, Any]) -> list[dict[str, str]]:
    """One short judgement per table row: ``{"row", "level" (ok/info/warn), "message"}``.

    Rows: ``device``, ``matmul.<dtype>``, ``memory_copy``, ``model.<mode>``, ``overhead``,
    ``data``, ``checkpoint``, ``compile``. Pure: tests feed it injected numbers.
    """
    rules = (_device_verdicts, _peak_verdicts, _model_verdicts, _overhead_verdicts)
    rules += (_data_verdicts, _checkpoint_verdicts, _compile_verdicts)
    return [verdict for rule in rules for verdict in rule(doc)]


def _verdict(row: str, level: str, message: str) -> dict[str, str]:
    return {"row": row, "level": level, "message": message}


def times(x: float) -> str:
    """A speed ratio as people say it: 1.6x, 35x, 0.95x."""
    if x >= 9.95:
        return f"{x:.0f}x"
    return f"{x:.1f}x" if x >= 1.195 or x <= 0.805 else f"{x:.2f}x"


def _device_verdicts(doc: dict[str, Any]) -> list[dict[str, str]]:
    device, caps = doc["device"], doc["device"]["capabilities"]
    if device["backend"] == "cuda":
        units = [n for n in ("bf16", "fp16", "tf32") if caps[n]]
        what = "/".join(units) + " tensor cores" if units else "no low-precision tensor cores"
        return [
            _verdict("device", "info", f"compute capability {caps['compute_capability']}: {what}")
        ]
    if device["backend"] == "cpu":
        native = [f.upper().replace("_", "-") for f in caps["isa"] if "bf16" in f or "amx" in f]
        if caps["bf16"]:
            return [_verdict("device", "ok", f"native bf16 ({', '.join(native)})")]
        return [_verdict("device", "info", "no native bf16: bf16 autocast is emulated here")]
    return []


def _peak_verdicts(doc: dict[str, Any]) -> list[dict[str, str]]:
    peaks, out = doc["peaks"], []
    matmul, vendor = peaks["matmul"], peaks["vendor_tflops"]
    fp32 = matmul["fp32"]["tflops"] if matmul.get("fp32") else None
    for name, peak in matmul.items():
        if not peak:
            continue
        if name == "fp32":
            message = "the fp32 limit; MFU below is measured against these peaks"
        else:
            message = f"{times(peak['tflops'] / fp32)} fp32" if fp32 else ""
        table = vendor["fp32"] if name in ("fp32", "tf32") else vendor["low_precision"]
        if table and name != "fp32":  # the table's fp32 column is TF32 on NVIDIA GPUs
            message += f"; {peak['tflops'] / table:.0%} of the vendor's {table:g} TFLOP/s"
        out.append(_verdict(f"matmul.{name}", "info", message + _contention(peak["cpu_share"])))
    message = "bounds element-wise work (norms, optimizer)"
    share = peaks["memory_copy"]["cpu_share"]
    out.append(_verdict("memory_copy", "info", message + _contention(share)))
    return out


def _model_verdicts(doc: dict[str, Any]) -> list[dict[str, str]]:
    model, backend = doc["model"], doc["device"]["backend"]
    configured, modes = model["configured"], model["modes"]
    best = max(modes, key=lambda m: modes[m]["tokens_per_s"])
    out = []
    for mode, row in modes.items():
        speed = row["speedup_vs_configured"]
        if mode == configured:
            level, message = "ok" if best == mode else "info", f"configured; {_mfu_text(row)}"
            if backend == "cuda" and (row["mfu_measured_peak"] or 1) < 0.2:
                level = "warn"
                message += "; small matmuls or overhead dominate: try compile: true or a larger "
                message += "data.micro_batch_size"
        elif mode == best and speed >= WORTH_SWITCHING:
            level, message = "warn", f"{mode} would be {times(speed)} faster: "
            message += f"set precision.mode: {mode}"
        elif speed >= 1 / WORTH_SWITCHING and speed < WORTH_SWITCHING:
            level, message = "info", f"about as fast as {configured} ({times(speed)})"
        elif speed > 1:
            level, message = "info", f"{times(speed)} faster than {configured}"
        else:
            level, message = "info", f"{times(1 / speed)} slower than {configured}"
        out.append(_verdict(f"model.{mode}", level, message + _contention(row["cpu_share"])))
    return out


def _mfu_text(row: dict[str, Any]) -> str:
    measured, vendor = row["mfu_measured_peak"], row["mfu_vendor_peak"]
    if measured is None:
        return "MFU n/a (no measured peak for this dtype)"
    text = f"MFU {measured:.0%} of the measured {row['precision']} matmul peak"
    return text + (f", {vendor:.0%} of the vendor peak" if vendor is not None else "")


def _contention(share: float | None) -> str:
    if share is None or share >= CONTENDED:
        return ""
    return f" (another process used the CPU meanwhile: {share:.0%} share; rerun when quiet)"


def _overhead_verdicts(doc: dict[str, Any]) -> list[dict[str, str]]:
    o = doc["overhead"]
    ratio = o["ratio"]
    message = f"Trainer runs at {ratio:.2f}x a raw PyTorch loop"
    if ratio >= OVERHEAD_OK:
        level, message = "ok", message + ": overhead within the noise"
    elif ratio >= OVERHEAD_WARN:
        level, message = "info", message + f" ({1 - ratio:.0%} overhead)"
    else:
        level = "warn"
        message += f": {1 - ratio:.0%} overhead; if a quiet rerun agrees, please report it"
    if o["clean_rounds"] < o["rounds"]:
        message += f" ({o['rounds'] - o['clean_rounds']} of {o['rounds']} rounds shared the CPU)"
    return [_verdict("overhead", level, message)]


def _data_verdicts(doc: dict[str, Any]) -> list[dict[str, str]]:
    d = doc["data"]
    headroom, wait = d["headroom"], d["data_wait_share"]
    if headroom >= HEADROOM_OK:
        level, message = "ok", f"data loader has {times(headroom)} headroom"
    elif headroom >= 1:
        level = "warn"
        message = f"data loader has only {times(headroom)} headroom: raise data.num_workers"
    else:
        level = "warn"
        message = (
            f"data loader is the bottleneck ({times(headroom)} the model's rate): "
            "raise data.num_workers"
        )
    if wait is not None and wait > 0.05:
        level, message = "warn", message + f"; training waited for data {wait:.0%} of the time"
    return [_verdict("data", level, message)]


def _checkpoint_verdicts(doc: dict[str, Any]) -> list[dict[str, str]]:
    c = doc["checkpoint"]
    step_s = doc["model"]["modes"][doc["model"]["configured"]]["step_time_s"]
    message = f"a save takes {c['save_s']:.2g} s, the time of {c['save_s'] / step_s:.1f} steps"
    interval = c["interval"]
    if not interval:
        return [_verdict("checkpoint", "info", message + "; saved only at the end")]
    share = c["save_s"] / (interval * step_s + c["save_s"])
    if share > CHECKPOINT_COST_WARN:
        message += f"; every {interval} steps costs {share:.0%} of training time: raise "
        return [_verdict("checkpoint", "warn", message + "checkpoint.interval")]
    return [_verdict("checkpoint", "ok", message + f"; every {interval} steps costs {share:.1%}")]


def _compile_verdicts(doc: dict[str, Any]) -> list[dict[str, str]]:
    c = doc["compile"]
    if not c["enabled"]:
        return [_verdict("compile", "info", "off in this config (compile: true measures it)")]
    if c["fell_back"]:
        message = "torch.compile failed, training ran eagerly: set compile: false"
        return [_verdict("compile", "warn", message)]
    speed, compile_s = c["speedup"], c["compile_s"]
    if speed >= WORTH_SWITCHING:
        step = doc["config"]["tokens_per_step"]
        saved = step / c["eager_tokens_per_s"] - step / c["compiled_tokens_per_s"]
        message = f"torch.compile is {times(speed)} faster after {compile_s:.0f} s of compiling"
        return [
            _verdict("compile", "ok", message + f" (pays off after {compile_s / saved:.0f} steps)")
        ]
    if speed >= 1 / WORTH_SWITCHING:
        message = f"torch.compile makes little difference ({times(speed)}) "
        return [_verdict("compile", "info", message + f"and takes {compile_s:.0f} s to compile")]
    message = f"torch.compile is slower here ({times(speed)}): set compile: false"
    return [_verdict("compile", "warn", message)]

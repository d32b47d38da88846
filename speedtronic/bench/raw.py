"""The hand-written training loop that the Trainer is measured against, and how to time both.

This module owns ``RawLoop`` (the loop a competent user writes by hand, with the Trainer's
model/optimizer recipe), ``build_raw`` (an independent copy of a runtime's model, optimizer,
scheduler and data with identical initial weights), and the ABBA alternation of timed rounds
with their ratio statistics. ``speedtronic bench`` (engine overhead line) and
``benchmarks/engine/overhead.py`` share this one implementation.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from speedtronic.bench.probes import synchronize
from speedtronic.config import SpeedtronicConfig
from speedtronic.data import build_dataloader
from speedtronic.errors import TrainingError
from speedtronic.optim.build import build_optimizer, build_scheduler
from speedtronic.registry import build_model
from speedtronic.runtime import Runtime, seed_everything
from speedtronic.train.trainer import extract_loss

# A timed round in which a side had less of the CPU than this (CPU time / (wall * threads))
# shared the cores with another process; such rounds are left out of the "clean" ratio.
IDLE_SHARE = 0.97


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
    budget_s: float | None = None,
) -> Timings:
    """Warm both sides up, then time ``rounds`` rounds of each, in ABBA order.

    The order flips every round, so slow drift of the machine hits both sides alike. With
    ``raw=None`` only the Trainer is timed. With ``budget_s``, no new round starts once the
    timed rounds have taken that long (steps can turn out far slower than a warm-up said,
    e.g. when another process takes the cores); at least one round is always timed.
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
    start = time.perf_counter()
    for r in range(rounds):
        for side in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            timings.time(side, sides[side], device)
        if report is not None:
            report(timings.line(label))
        if budget_s is not None and time.perf_counter() - start >= budget_s:
            break
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

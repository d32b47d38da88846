"""Trainer overhead: Speedtronic's Trainer against a minimal hand-written PyTorch loop.

Usage::

    python benchmarks/overhead.py                       # smoke and 10m, the configs' precision
    python benchmarks/overhead.py --config 10m --precision fp32 bf16 --rounds 7

Both sides run in ONE process on the same device and threads and do the same work:

* model: the configured ``reference_transformer``, built twice from the same seed (checked
  equal before timing); each side owns its model, AdamW optimizer and LR scheduler, so no
  state is shared. The optimizer comes from ``speedtronic.optim.build_optimizer`` for both
  (same param groups, same fused/foreach kernel) and the schedule from ``build_scheduler``.
* data: each side reads its own ``speedtronic.data.build_dataloader(config)`` (the same
  ``SyntheticTokens`` dataset, micro-batch size, sampler order and worker settings); the
  Trainer wraps it in its ``DataStream``, the raw loop iterates it directly.
* precision, gradient accumulation and clipping: the Trainer's resolved autocast dtype, the
  config's accumulation count and max grad norm.

Each side first runs ``--warmup`` optimizer steps (not timed); then ``--rounds`` rounds of
``--steps`` timed optimizer steps alternate between the sides, in ABBA order (the order flips
every round) so slow drift of the machine hits both sides alike. Reported: the median over
rounds of each side's tokens/s and of the per-round ratio trainer/raw, plus the spread.

On a shared machine other processes steal cores: each round's CPU share (process CPU time /
(wall time * threads)) exposes that. "clean ratio" keeps only the rounds where both sides had
>= 97% of the CPU (threads that wait for each other lose ~10% already at 94%); "cpu-time
ratio" (raw CPU seconds / trainer CPU seconds, per round) hardly moves with contention when
run with ``--threads 1``. ``--check`` exits 1 when a ratio misses its target.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from speedtronic.config import SpeedtronicConfig
from speedtronic.data import build_dataloader
from speedtronic.optim import build_optimizer, build_scheduler
from speedtronic.registry import build_model
from speedtronic.runtime import Runtime, build_runtime, count_parameters, seed_everything

TARGETS = {"smoke": 0.90, "10m": 0.97}  # minimum trainer/raw throughput ratio
# A round in which either side's process CPU share (CPU time / (wall time * torch threads)) is
# below this shared the cores with another process; ``ratio_clean`` leaves such rounds out.
IDLE_SHARE = 0.97
# (warm-up steps, timed steps per round) when --warmup / --steps are not given.
DEFAULT_STEPS = {"smoke": (10, 30), "10m": (2, 3)}
# ~10M parameters (9.8M): a small GQA decoder at seq_len 256, micro-batch 4 x 2 accumulation.
TEN_M = {
    "model": {"seq_len": 256, "n_layer": 6, "n_head": 6, "n_kv_head": 3, "d_model": 384},
    "data": {"micro_batch_size": 4, "target_batch_size": 8},
    "optimizer": {"lr": 1.0e-3},
}


def build_config(
    name: str, precision: str, total_steps: int, log_every: int, output_dir: str
) -> dict:
    """The packaged smoke config, or the ~10M variant of it, as a plain dict."""
    raw = SpeedtronicConfig.default().to_dict(redact=False)
    if name == "10m":
        for section, values in TEN_M.items():
            raw[section].update(values)
    # max_steps is the schedule horizon; nothing is written, output_dir is a scratch folder.
    raw["run"].update(name=f"overhead-{name}", max_steps=total_steps, output_dir=output_dir)
    raw["precision"]["mode"] = precision
    raw["logging"].update(every_steps=log_every, file=None, json_file=None, hooks=[])
    raw["checkpoint"]["interval"] = 0
    return raw


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
                # Trainer's per-micro-batch weight (count / total count).
                loss = self.model(**batch) / self.accumulation
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


def build_raw(config: SpeedtronicConfig, runtime: Runtime) -> RawLoop:
    """A second, independent model/optimizer/scheduler/data built exactly like the runtime's."""
    seed_everything(config.run.seed)
    model = build_model(config.model.name, config.model.params, config.model.imports)
    model.to(runtime.precision.device).train()
    optimizer, kernel = build_optimizer(model, config.optimizer, runtime.logger.warn)
    if kernel != runtime.optimizer_kernel:
        raise SystemExit(
            f"optimizer kernel differs: raw {kernel}, trainer {runtime.optimizer_kernel}"
        )
    check_same_weights(model, runtime.model)
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
        raise SystemExit("the two models differ at initialisation; the comparison is unfair")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def drop_checkpoints(runtime: Runtime) -> None:
    """Detach the run's checkpoint plug-in: the raw loop does not save either.

    With ``checkpoint.interval: 0`` it saves once, when ``fit()`` returns, which would charge a
    full save to every timed round; saving has its own benchmark (``checkpoint.py``).
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
        raise SystemExit(f"trainer stopped early: {result.status} at step {trainer.step}")


@dataclass
class Timings:
    """Per side ("trainer", "raw"), per timed round: wall-clock and process CPU seconds."""

    tokens: int  # tokens per round
    threads: int  # torch intra-op threads
    on_cpu: bool  # CPU shares say something about contention only when the CPU does the work
    wall: dict[str, list[float]] = field(default_factory=lambda: {"trainer": [], "raw": []})
    cpu: dict[str, list[float]] = field(default_factory=lambda: {"trainer": [], "raw": []})

    def time(self, side: str, work: Callable[[], None], device: torch.device) -> None:
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
            f"{s} {self.rates(s)[-1]:,.0f} tok/s (cpu {self.shares(s)[-1]:.0%})" for s in self.wall
        )
        return f"  {label} round {len(self.wall['raw'])}: " + "  ".join(sides)


def measure(name: str, precision: str, args: argparse.Namespace) -> dict[str, Any]:
    """Build both sides for one config and precision, time them; returns the summary row."""
    warmup, steps = DEFAULT_STEPS[name]
    warmup, steps = args.warmup if args.warmup is not None else warmup, args.steps or steps
    with tempfile.TemporaryDirectory(prefix="speedtronic-overhead-") as scratch:
        total = warmup + args.rounds * steps
        runtime = build_runtime(
            build_config(name, precision, total, args.log_every, scratch), console=False
        )
        drop_checkpoints(runtime)
        raw = build_raw(runtime.config, runtime)
        timings = alternate(runtime, raw, warmup, steps, args.rounds)
    row = summarize(name, runtime, raw, timings)
    return row | {"warmup_steps": warmup, "steps_per_round": steps}


def alternate(runtime: Runtime, raw: RawLoop, warmup: int, steps: int, rounds: int) -> Timings:
    """Warm both sides up, then time ``rounds`` rounds of each, in ABBA order."""
    if warmup:
        run_trainer(runtime, warmup)
        raw.run(warmup)
    sides = {"trainer": lambda: run_trainer(runtime, steps), "raw": lambda: raw.run(steps)}
    tokens, on_cpu = steps * runtime.config.tokens_per_step, raw.device.type == "cpu"
    timings = Timings(tokens, torch.get_num_threads(), on_cpu)
    label = f"{runtime.config.run.name}/{runtime.precision.mode}"
    for r in range(rounds):
        for side in ("trainer", "raw") if r % 2 == 0 else ("raw", "trainer"):
            timings.time(side, sides[side], raw.device)
        print(timings.line(label), file=sys.stderr, flush=True)
    return timings


def spread(values: list[float]) -> float:
    """(max - min) / median, in percent."""
    return 100.0 * (max(values) - min(values)) / statistics.median(values)


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


def summarize(name: str, runtime: Runtime, raw: RawLoop, timings: Timings) -> dict[str, Any]:
    config, stats = runtime.config, ratio_stats(timings)
    return {
        "config": name,
        "precision": runtime.precision.mode,
        "device": str(runtime.precision.device),
        "threads": timings.threads,
        "params": count_parameters(runtime.model),
        "optimizer": runtime.optimizer_kernel,
        "micro_batch_size": config.data.micro_batch_size,
        "accumulation_steps": config.accumulation_steps,
        "seq_len": config.seq_len,
        "tokens_per_step": config.tokens_per_step,
        "rounds": len(stats["round_ratios"]),
        "trainer_tokens_per_s": statistics.median(timings.rates("trainer")),
        "raw_tokens_per_s": statistics.median(timings.rates("raw")),
        "trainer_spread_pct": spread(timings.rates("trainer")),
        "raw_spread_pct": spread(timings.rates("raw")),
        "target": TARGETS[name],
        "ok": stats["ratio"] >= TARGETS[name],
        "trainer_skipped_steps": runtime.trainer.skipped_steps,
        "final_loss_trainer": runtime.trainer.last_loss,
        "final_loss_raw": raw.last_loss,
        **stats,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'config':<7}{'prec':<6}{'params':>11}{'tok/step':>9}{'raw tok/s':>11}"
        f"{'trainer tok/s':>15}{'ratio':>7}{'ratio range':>15}{'spread raw/tr':>15}"
        f"{'clean ratio':>16}{'cpu-time ratio':>16}{'target':>8}  ok"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        clean = row["ratio_clean"]
        clean_text = f"{clean:.3f} ({row['clean_rounds']}/{row['rounds']})" if clean else "none"
        print(
            f"{row['config']:<7}{row['precision']:<6}{row['params']:>11,}"
            f"{row['tokens_per_step']:>9,}{row['raw_tokens_per_s']:>11,.0f}"
            f"{row['trainer_tokens_per_s']:>15,.0f}{row['ratio']:>7.3f}"
            f"{row['ratio_min']:>9.3f}-{row['ratio_max']:.3f}"
            f"{row['raw_spread_pct']:>8.1f}%/{row['trainer_spread_pct']:.1f}%"
            f"{clean_text:>16}{row['ratio_cpu_time']:>16.3f}"
            f"{row['target']:>8.2f}  {'yes' if row['ok'] else 'NO'}"
        )
    if any(row["clean_rounds"] < row["rounds"] for row in rows):
        print(
            f"note: some rounds ran with under {IDLE_SHARE:.0%} of the CPU (another process was "
            "busy); 'clean ratio' is the median over the other rounds. Rerun on a quiet machine, "
            "or with --threads 1 and read the cpu-time ratio.",
            file=sys.stderr,
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", choices=sorted(TARGETS), default=["smoke", "10m"])
    parser.add_argument(
        "--precision",
        nargs="+",
        choices=["auto", "fp32", "bf16"],
        default=["auto"],
        help="one run per mode; auto = the config's resolved mode",
    )
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per side")
    parser.add_argument("--steps", type=int, help="timed optimizer steps per round")
    parser.add_argument("--warmup", type=int, help="untimed optimizer steps per side first")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--log-every", type=int, default=10, help="logging.every_steps")
    parser.add_argument("--check", action="store_true", help="exit 1 if a ratio misses target")
    args = parser.parse_args(argv)
    positive = (args.rounds, args.steps, args.threads, args.log_every)
    if any(n is not None and n < 1 for n in positive) or (args.warmup or 0) < 0:
        parser.error("--rounds, --steps, --threads and --log-every must be >= 1, --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rows = [measure(name, mode, args) for name in args.config for mode in args.precision]
    print_table(rows)
    print(json.dumps({"benchmark": "trainer_overhead", "results": rows}))
    return 1 if args.check and not all(row["ok"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

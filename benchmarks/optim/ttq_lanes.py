"""The machinery behind ``time_to_quality.py``: arms, the runs they make, and the race.

An **arm** is a recipe (optimizer, its lr, schedule, model options) at one horizon (the steps
its schedule lasts). A **lane** is one arm trained on one seed by the product itself
(``build_runtime``, ``Trainer.train_step``): each step is timed (``perf_counter``, data loading
included; on CUDA with a synchronize), and so is its ``optimizer.step`` (a wrapper on the
instance). Evaluations are not timed: the held-out loss of the fixed eval batches, through the
run's own ``EvalPlugin``, every ``coarse`` steps, every ``fine`` steps once within ``near`` of
the target, and at the horizon.

A **race** runs its lanes in one process, a chunk (the steps to each lane's next evaluation) at
a time, in ABBA order, so that a change in the machine's load hits every lane alike; a lane
stops at its first evaluation at or below the target (or at its horizon).

Arm names: ``adamw`` or ``muon``, then ``_``-separated modifiers: ``lr<x>`` (AdamW's lr, also
the AdamW half of muon), ``mlr<x>`` (Muon's lr), ``rms`` (``muon_lr_adjust:
match_rms_adamw``), ``mw<n>`` (Muon momentum warm-up over n steps), ``wsd`` (warmup-stable-decay
schedule), ``qk`` (QK-norm), ``z`` (zero-initialised output projections), ``fp32`` (the
Newton-Schulz iteration in fp32); ``@<n>`` sets the horizon.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from speedtronic.evaluate.loss_plugin import EvalPlugin
from speedtronic.runtime import build_runtime

SEQ_LEN = 128
BATCH = 32  # sequences per step: 32 x 128 = 4,096 tokens, the pilot's batch (issue 30)
# held-out batches of 32 x 128, the same ones every time: 65,536 tokens (large: 32,768, whose
# evaluation would otherwise cost as much as its training at this cadence)
EVAL_BATCHES = {"small": 16, "large": 8, "quick": 2}
EVAL_FRACTION = 0.05  # the corpus tail held out (as diloco/convergence.py)
WARMUP = 20
CADENCE = {"small": (25, 5), "large": (50, 10), "quick": (4, 2)}  # (coarse, fine) eval steps
SIZES = {  # the pilot's 0.43M shape, and one about 10x larger
    "small": dict(d_model=128, n_layer=2, n_head=4, n_kv_head=2),
    "large": dict(d_model=256, n_layer=6, n_head=4, n_kv_head=2),
    "quick": dict(d_model=32, n_layer=1, n_head=2, n_kv_head=1),
}


@dataclass(frozen=True)
class Arm:
    name: str
    optimizer: str  # adamw | muon
    horizon: int
    lr: float
    muon_lr: float | None = None
    rms: bool = False
    momentum_warmup: int = 0
    wsd: bool = False
    qk_norm: bool = False
    zero_init: bool = False
    ns_fp32: bool = False


def parse_arm(name: str, tuned: dict[str, Any], default_horizon: int) -> Arm:
    """``muon_mlr0.03_wsd@400`` -> Arm; unset lrs come from the size's frozen ``tuned``."""
    recipe, _, horizon = name.partition("#")[0].partition("@")  # "#aa": a twin lane
    head, *mods = recipe.split("_")
    if head not in ("adamw", "muon"):
        raise ValueError(f"arm {name!r}: starts with adamw or muon")
    values: dict[str, Any] = {"lr": tuned["adamw_lr"]}
    if head == "muon":  # its AdamW half's lr is its own, tuned with it
        values["lr"] = tuned.get("muon_adamw_lr", tuned["adamw_lr"])
        values["muon_lr"] = tuned.get("muon_lr")
    flags = {"rms": "rms", "wsd": "wsd", "qk": "qk_norm", "z": "zero_init", "fp32": "ns_fp32"}
    for mod in mods:
        if mod in flags:
            values[flags[mod]] = True
        elif mod.startswith("mlr") and head == "muon":
            values["muon_lr"] = float(mod[3:])
        elif mod.startswith("mw") and head == "muon":
            values["momentum_warmup"] = int(mod[2:])
        elif mod.startswith("lr"):
            values["lr"] = float(mod[2:])
        else:
            raise ValueError(f"arm {name!r}: unknown modifier {mod!r}")
    if values.get("rms") and not any(m.startswith("mlr") for m in mods):
        values["muon_lr"] = None  # RMS-matched: AdamW's lr carries over
    steps = int(horizon) if horizon else default_horizon
    return Arm(name, head, steps, **values)


def lane_config(arm: Arm, size: str, seed: int, corpus: str, out_dir: str, device: str) -> dict:
    optimizer: dict[str, Any] = {"name": arm.optimizer, "lr": arm.lr, "weight_decay": 0.1}
    if arm.optimizer == "muon":
        if arm.muon_lr is not None:
            optimizer["muon_lr"] = arm.muon_lr
        if arm.rms:
            optimizer["muon_lr_adjust"] = "match_rms_adamw"
        if arm.momentum_warmup:
            optimizer["muon_momentum_warmup_steps"] = arm.momentum_warmup
        if arm.ns_fp32:
            optimizer["muon_precision"] = "fp32"
    model = {"name": "reference_transformer", "vocab_size": 256, "seq_len": SEQ_LEN}
    model.update(SIZES[size])
    if arm.qk_norm:
        model["qk_norm"] = True
    if arm.zero_init:
        model["zero_init_projections"] = True
    return {
        "run": {
            "name": "ttq",
            "seed": seed,
            "device": device,
            "max_steps": arm.horizon,
            "output_dir": out_dir,
        },
        "model": model,
        "data": {
            "text_path": corpus,
            "tokenizer": "byte",
            "micro_batch_size": BATCH,
            "target_batch_size": BATCH,
            "eval_fraction": EVAL_FRACTION,
            "eval_every": 10**9,  # the plug-in exists; the lane calls it, untimed
            "eval_batches": EVAL_BATCHES[size],
        },
        "optimizer": {**optimizer, "grad_clip": 1.0},
        "scheduler": {
            "name": "wsd" if arm.wsd else "cosine",
            "warmup_steps": WARMUP,
            "min_lr_ratio": 0.1,
        },
        "precision": {"mode": "fp32"},
        "checkpoint": {"interval": 0},
        "logging": {"every_steps": 10**9},
    }


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Lane:
    """One arm on one seed: its runtime, its clock and its curve."""

    arm: Arm
    seed: int
    runtime: Any
    target: float | None
    coarse: int
    fine: int
    near: float
    train_s: float = 0.0  # timed steps only
    cpu_s: float = 0.0  # their CPU time: what the wall-clock would be with the cores to itself
    optimizer_s: float = 0.0
    curve: list[list[float]] = field(default_factory=list)  # [step, train_s, eval loss, cpu_s]
    reached: tuple[int, float, float] | None = None  # (step, train_s, cpu_s): first eval <= target
    status: str = "running"

    def __post_init__(self) -> None:
        self.trainer = self.runtime.trainer
        self.device = self.runtime.precision.device
        self.evaluator = next(p for p in self.trainer.plugins if isinstance(p, EvalPlugin))
        inner = self.runtime.optimizer.step  # the scheduler's wrapper: time what it calls

        def timed_step(*args: Any, **kwargs: Any) -> Any:
            synchronize(self.device)
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                synchronize(self.device)
                self.optimizer_s += time.perf_counter() - start

        timed_step._wrapped_by_lr_sched = True  # the scheduler's own mark: it still counts
        self.runtime.optimizer.step = timed_step
        self.runtime.model.train()

    @property
    def step(self) -> int:
        return self.trainer.step

    @property
    def active(self) -> bool:
        return self.status == "running"

    def next_chunk(self) -> int:
        last = self.curve[-1][2] if self.curve else math.inf
        every = self.fine if self.target and last <= self.target * (1 + self.near) else self.coarse
        return min(every - self.step % every, self.arm.horizon - self.step)

    def advance(self) -> None:
        """The steps to the next evaluation (timed), then the evaluation (not timed)."""
        for _ in range(self.next_chunk()):
            synchronize(self.device)
            start, cpu = time.perf_counter(), time.process_time()
            self.trainer.train_step()
            synchronize(self.device)
            self.train_s += time.perf_counter() - start
            self.cpu_s += time.process_time() - cpu
        loss = self.evaluate()
        if not math.isfinite(loss):
            self.status = "diverged"
        elif self.target is not None and loss <= self.target and self.reached is None:
            self.reached = (self.step, self.train_s, self.cpu_s)
            self.status = "reached"
        elif self.step >= self.arm.horizon:
            self.status = "missed" if self.target is not None else "done"

    def evaluate(self) -> float:
        loss = float(self.evaluator.evaluate(self.trainer)["eval_loss"])
        finite = loss if math.isfinite(loss) else math.inf
        self.curve.append([self.step, self.train_s, finite, self.cpu_s])
        return loss

    def record(self) -> dict[str, Any]:
        steps = max(1, self.step)
        return {
            "arm": self.arm.name,
            "seed": self.seed,
            "horizon": self.arm.horizon,
            "status": self.status,
            "target": self.target,
            "reached_step": self.reached[0] if self.reached else None,
            "reached_s": self.reached[1] if self.reached else None,
            "reached_cpu_s": self.reached[2] if self.reached else None,
            "steps": self.step,
            "train_s": self.train_s,
            "cpu_s": self.cpu_s,
            "step_ms": 1000 * self.train_s / steps,
            "optimizer_share": self.optimizer_s / self.train_s if self.train_s else None,
            "last_eval_loss": self.curve[-1][2] if self.curve else None,
            "curve": self.curve,
        }


def race(
    plan: list[tuple[Arm, int]],
    size: str,
    corpus: str,
    target: float | None,
    device: str = "cpu",
    coarse: int | None = None,
    fine: int | None = None,
    near: float = 0.02,
) -> list[dict[str, Any]]:
    """Every (arm, seed) of ``plan`` as a lane of one race; the lanes' records, with the load
    averages before and after. Evaluations every ``coarse`` steps (``CADENCE``: 25 small, 50
    large, whose evaluation costs 10 training steps), every ``fine`` steps within ``near``."""
    coarse, fine = coarse or CADENCE[size][0], fine or CADENCE[size][1]
    with tempfile.TemporaryDirectory(prefix="speedtronic-ttq-") as tmp:
        lanes = []
        for i, (arm, seed) in enumerate(plan):
            config = lane_config(arm, size, seed, corpus, str(Path(tmp) / f"lane{i}"), device)
            runtime = build_runtime(config, console=False)
            lanes.append(Lane(arm, seed, runtime, target, coarse, fine, near))
        load_before = os.getloadavg()
        for lane in lanes:
            lane.evaluate()  # step 0: the initial weights
        rounds = 0
        while any(lane.active for lane in lanes):
            order = lanes if rounds % 2 == 0 else lanes[::-1]  # ABBA: no lane always first
            for lane in order:
                if lane.active:
                    lane.advance()
            rounds += 1
        load_after = os.getloadavg()
    return [{**lane.record(), "size": size, "load_before": load_before, "load_after": load_after}
            for lane in lanes]  # fmt: skip

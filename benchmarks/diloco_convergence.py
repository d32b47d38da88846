"""DumbDiLoCo convergence: the DiLoCo paper's main comparison at tiny scale, on real text.

Usage::

    python benchmarks/diloco_convergence.py --quick                    # ~20 s smoke run
    python benchmarks/diloco_convergence.py --arms a,c --seeds 0       # some arms, in-process
    PYTHONPATH=. python benchmarks/diloco_convergence.py --jobs 16 --out results.json \\
        --png docs/diloco_convergence.png                              # everything, 2 seeds
    python benchmarks/diloco_convergence.py --plot results.json --png docs/diloco_convergence.png

What runs (``--arms``; ``all``, the default, is the plan below; ``sweep`` expands to the
outer-optimizer grid). Every arm starts from the same initial weights per seed, trains the
same ~0.43M-parameter ``reference_transformer`` on byte-level Python stdlib source, and is
scored by the eval loss of its *global* weights on the held-out tail of the corpus:

* ``a``  one worker, plain training: ``--steps`` optimizer steps of ``--batch`` sequences.
* ``b``  synchronous data parallel over 4 workers = one Trainer with 4x the batch for
  ``--steps`` steps (a ring all-reduce of the mean gradient computes exactly this).
* ``c``  DumbDiLoCo, 4 equal workers, ``--steps`` inner steps each, H = ``--inner-steps``,
  the defaults: ``outer.MasterConfig()`` (plain averaging: outer lr 1.0, momentum 0, the fleet
  policy, min_deltas 2, staleness discount 0.5, max_staleness 4, max_wait_s 600), bf16 deltas,
  inner AdamW state reset at each boundary. ``c4``: the same with min_deltas 4.
* ``c_lr<LR>_m<MOM>`` (``sweep``): ``c`` with another outer lr / momentum; ``c_lr1.0_m0`` is
  plain averaging. Modifiers combine with any DiLoCo arm: ``_lr<f>`` outer lr, ``_m<f>``
  momentum, ``_md<n>`` min_deltas, ``_sd<f>`` staleness discount, ``_ms<n>`` max_staleness,
  ``_dt<fp32|bf16|int8>`` delta encoding, ``_keep`` keep the inner AdamW state (no reset),
  ``_mp<S>`` master polls every S simulated seconds, ``_sync`` (below).
* ``c4_sync``, ``c4_sync_lr1.0_m0``: the opt-in ``distributed.sync_wait_s`` (here unbounded):
  each worker waits at its boundary until the round holding its delta is published, then
  installs it, which is the paper's synchronous DiLoCo (``c4_sync_lr0.7_m0.9``) and synchronous
  periodic averaging, run through the same code; the event loop models the wait.
* ``d``  4 uneven workers, speeds 1 : 1.3 : 2.6 : 5.7 (``--speeds``), default policy;
  ``d_lr0.5_m0`` the same workers with the outer optimizer that suits asynchrony best so far.
* ``e``  the same workers, naive async: each delta applied alone (min_deltas 1, staleness
  discount 1.0) with Nesterov 0.9, outer lr 0.7.
* ``<arm>:warm``: the arm starts from a checkpoint that one worker (worker 0's data order,
  i.e. arm ``a``) trained for the first half (``--steps``/2 steps, its cosine schedule over
  ``--steps``); then every worker trains the other half. The inner lr schedule continues where
  the warm-start run left it (decaying to the floor at each worker's last step); AdamW starts
  fresh; worker 0 skips the blocks the warm-start run read. Curves count tokens from the warm
  start.

Equal tokens: ``a`` sees ``--steps`` x batch tokens; ``b``, ``c`` and every 4-worker arm see
4x that (each worker ``--steps`` steps). The uneven arms (``d``, ``e``) get the same total as
``c`` (``--uneven-budget tokens``, the default): all four workers train for the same simulated
wall-clock time, so worker ``i`` does ``4 x steps x speed_i / sum(speeds)`` steps (226, 294,
589, 1291 for 600 steps). ``--uneven-budget fastest`` instead gives the fastest worker
``--steps`` steps and the others proportionally fewer (fewer tokens in total than ``c``).

How the nodes run: in ONE process, with the real code: a ``MasterLoop`` over a
``LocalTransport`` on a temporary directory, and per worker a real Trainer from
``build_runtime`` with a ``WorkerPlugin(background=False)``. Every worker reads the corpus in
its own order (its own ``run.seed``); the master publishes the initial weights and each
worker's ``on_train_start`` installs them. A simulated clock orders events: worker ``i``'s
optimizer step takes ``--step-seconds / speed_i`` simulated seconds, and the worker whose step
ends next acts (ties: lowest worker index). A worker's background poller is modelled as always
up to date: right before a step that ends an inner loop, the caller runs ``refresh()``, so the
boundary installs the newest published global. After each step the caller runs
``send_pending()`` (uploads are instant) and, with ``--master-poll 0`` (default), the master
runs ``poll_once()`` right after every upload; with ``--master-poll S`` it polls every S
simulated seconds instead. The master's quorum timer (``max_wait_s``) reads the simulated clock
(the benchmark points ``speedtronic.distributed.master``'s ``time.monotonic`` at it). When the
last worker ends, ``poll_once(force=True)`` aggregates what is left, as a master's final round
does. Every ``--eval-every`` steps per worker (in tokens: all workers together) the published
global is read back from the repo, ``decode_weights``-validated, loaded into an eval model and
evaluated on ``--eval-batches`` held-out batches (the same batches every time; the final
number too, unless ``--final-eval-batches`` asks for more).

Bytes: per worker, delta bytes uploaded + global bytes downloaded (the worker's counters),
against synchronous data parallel's ring all-reduce of fp32 gradients for the same tokens:
``2 x params x 4 bytes x (n-1)/n`` sent per worker per step, for ``steps`` steps (the same
amount is received again, which this comparison leaves out, in all-reduce's favour).

Prints a table and one JSON line (``{"benchmark": "diloco_convergence", ...}``); ``--out``
writes the same JSON to a file, ``--png`` plots it (matplotlib, imported only for the plot).
Targets (issue 8): (c) no worse than (a); the best (c') >= 3% below (a); (d) stable (no rise
of eval loss after warm-up) and within 1% of (c); (e) visibly worse than (d).
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "examples"))

import torch  # noqa: E402
from train_text import write_stdlib_corpus  # noqa: E402  (the example's corpus)

from speedtronic.distributed.codec import decode_weights, expected_delta_bytes  # noqa: E402
from speedtronic.distributed.master import MasterLoop  # noqa: E402
from speedtronic.distributed.outer import MasterConfig  # noqa: E402
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, BadDelta  # noqa: E402
from speedtronic.distributed.transport import LocalTransport  # noqa: E402
from speedtronic.distributed.worker import WorkerPlugin, parameters_of, snapshot  # noqa: E402
from speedtronic.errors import SpeedtronicError  # noqa: E402
from speedtronic.evaluation import EvalPlugin  # noqa: E402
from speedtronic.runtime import build_runtime, count_parameters  # noqa: E402

EVAL_FRACTION = 0.05  # the corpus tail held out for evaluation, never trained on
# The outer-optimizer sweep (c'), under the default round policy. Asynchrony makes every delta
# at least one round stale, and min_deltas 2 with 4 workers makes two rounds per inner loop, so
# the grid reaches well below the paper's lr 0.7 / momentum 0.9.
SWEEP = ["c_lr1.0_m0", "c_lr0.7_m0", "c_lr0.5_m0", "c_lr0.35_m0", "c_lr0.25_m0.5", "c_lr0.1_m0.9"]
# distributed.sync_wait_s: workers wait at each boundary until the round with their delta is
# published, i.e. the paper's synchronous DiLoCo; with the inner AdamW state kept, the best
REFERENCES = ["c4_sync_lr0.7_m0.9", "c4_sync", "c4_sync_keep", "c_keep", "c4_keep"]
COLD = [
    "a",
    "b",
    "c",
    "c4",
    *REFERENCES,
    *SWEEP,
    "c_lr0.5_m0_keep",
    "c4_lr1.0_m0",
    "d",
    "e",
    "d_lr0.5_m0",
]
WARM = ["a", "b", "c", "c4", "c4_sync", "c4_sync_keep", "d", "e"]
ALL = COLD + [f"{arm}:warm" for arm in WARM]
UNEVEN_SPEEDS = (1.0, 1.3, 2.6, 5.7)
STABLE_RISE = 0.01  # "no rise after warm-up": no eval loss > 1% above the best one before it


@dataclass(frozen=True)
class Scale:
    """Model, data and schedule sizes shared by every arm."""

    steps: int = 600  # optimizer steps per worker (inner steps), per arm
    inner_steps: int = 50  # H
    batch: int = 16  # sequences per worker step
    seq_len: int = 64
    d_model: int = 128
    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int = 2
    lr: float = 3.0e-3
    warmup: int = 20
    workers: int = 4
    speeds: tuple[float, ...] = UNEVEN_SPEEDS
    uneven_budget: str = "tokens"
    eval_every: int = 50  # steps per worker between evaluations
    eval_batches: int = 8  # 8 x 128 x 64 = 65k held-out tokens, the same ones every time
    final_eval_batches: int = 8  # more (a superset) for the final number only, if wanted
    eval_batch: int = 128  # sequences per eval batch
    step_seconds: float = 1.0  # simulated duration of a speed-1 worker's step
    master_poll: float = 0.0  # simulated seconds between master polls; 0: after every upload
    device: str = "cpu"


QUICK = dict(
    steps=8,
    inner_steps=2,
    batch=4,
    warmup=2,
    eval_every=2,
    eval_batches=1,
    final_eval_batches=1,
    eval_batch=32,
)


# ---------------------------------------------------------------------- arms


@dataclass(frozen=True)
class Arm:
    """One arm of the comparison, parsed from its name (module docstring)."""

    name: str
    kind: str  # "single" | "dp" | "diloco"
    warm: bool = False
    uneven: bool = False
    policy: dict[str, Any] = field(default_factory=dict)  # MasterConfig fields
    reset_inner: bool = True
    reapply_own: bool = True  # distributed.reapply_own_delta
    delta_dtype: str = "bf16"
    master_poll: float | None = None  # None: --master-poll
    sync: bool = False  # reference only: workers block at boundaries (the paper's DiLoCo)

    @property
    def base(self) -> str:
        return self.name.split(":")[0]


def parse_arm(name: str) -> Arm:
    base, _, start = name.partition(":")
    if start not in ("", "warm", "cold"):
        raise ValueError(f"arm {name!r}: the suffix must be :warm or :cold")
    warm = start == "warm"
    head, *mods = base.split("_")
    if head in ("a", "b"):
        if mods:
            raise ValueError(f"arm {name!r}: a and b take no modifiers")
        return Arm(base + (":warm" if warm else ""), "single" if head == "a" else "dp", warm)
    defaults = asdict(MasterConfig())
    policy = {
        k: defaults[k]
        for k in (
            "outer_lr",
            "outer_momentum",
            "min_deltas",
            "max_wait_s",
            "max_staleness",
            "staleness_discount",
            "policy",
        )
    }
    if head == "c4":
        policy["min_deltas"] = 4
    elif head == "e":
        policy.update(
            min_deltas=1, staleness_discount=1.0, outer_momentum=0.9, outer_lr=0.7, policy="naive"
        )
    elif head not in ("c", "d"):
        raise ValueError(f"arm {name!r}: unknown arm {head!r} (a, b, c, c4, d, e)")
    arm = Arm(base + (":warm" if warm else ""), "diloco", warm, head in ("d", "e"), policy)
    for mod in mods:
        arm = _apply_modifier(arm, mod, name)
    MasterConfig(**{k: v for k, v in arm.policy.items()})  # validates the values
    return arm


def _apply_modifier(arm: Arm, mod: str, name: str) -> Arm:
    if mod == "keep":
        return replace(arm, reset_inner=False)
    if mod == "sync":
        return replace(arm, sync=True)
    if mod == "bare":  # install the bare global (reapply_own_delta: false)
        return replace(arm, reapply_own=False)
    if mod.startswith("mp"):
        with contextlib.suppress(ValueError):
            return replace(arm, master_poll=float(mod[2:]))
    if mod.startswith("dt") and mod[2:] in ("fp32", "bf16", "int8"):
        return replace(arm, delta_dtype=mod[2:])
    keys = {
        "md": ("min_deltas", int),
        "ms": ("max_staleness", int),
        "sd": ("staleness_discount", float),
        "lr": ("outer_lr", float),
        "m": ("outer_momentum", float),
    }
    for prefix in ("md", "ms", "sd", "lr", "m"):
        if mod.startswith(prefix):
            key, kind = keys[prefix]
            try:
                value = kind(mod[len(prefix) :])
            except ValueError:
                break
            return replace(arm, policy={**arm.policy, key: value})
    raise ValueError(f"arm {name!r}: unknown modifier {mod!r}")


def expand_arms(spec: str) -> list[str]:
    names: list[str] = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        if item == "all":
            names += ALL
        elif item in ("sweep", "sweep:warm"):
            names += [f"{a}:warm" if item.endswith(":warm") else a for a in SWEEP]
        else:
            names.append(item)
    arms = [parse_arm(n).name for n in names]
    return list(dict.fromkeys(arms))


def job_cost(arm: Arm, scale: Scale) -> float:
    """Relative cost (optimizer steps of one worker batch) for scheduling: longest first."""
    half = scale.steps // 2 if arm.warm else 0
    per_worker = scale.steps - half
    total = per_worker if arm.kind == "single" else scale.workers * per_worker
    return total + half


# ---------------------------------------------------------------------- corpus & runtimes


def make_config(
    scale: Scale,
    corpus: str,
    out_dir: str,
    seed: int,
    batch: int,
    horizon: int,
    eval_batches: int = 0,
) -> dict[str, Any]:
    """A worker's (or the eval model's) config; ``horizon`` is the cosine schedule's length."""
    return {
        "run": {
            "name": "diloco-convergence",
            "seed": seed,
            "device": scale.device,
            "max_steps": horizon,
            "output_dir": out_dir,
        },
        "model": {
            "name": "reference_transformer",
            "vocab_size": 256,
            "seq_len": scale.seq_len,
            "n_layer": scale.n_layer,
            "n_head": scale.n_head,
            "n_kv_head": scale.n_kv_head,
            "d_model": scale.d_model,
        },
        "data": {
            "text_path": corpus,
            "tokenizer": "byte",
            "micro_batch_size": batch,
            "target_batch_size": batch,
            "eval_fraction": EVAL_FRACTION,
            "eval_every": 10**9 if eval_batches else 0,
            "eval_batches": max(1, eval_batches),
        },
        "optimizer": {"lr": scale.lr, "weight_decay": 0.1, "grad_clip": 1.0},
        "scheduler": {"name": "cosine", "warmup_steps": scale.warmup, "min_lr_ratio": 0.1},
        "precision": {"mode": "fp32"},
        "checkpoint": {"interval": 0},
        "logging": {"every_steps": 10**9},
    }


def data_seed(seed: int, worker: int) -> int:
    """Worker ``w`` of seed ``s`` reads the corpus in its own order."""
    return 1000 * seed + worker + 1


def load_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, param in parameters_of(model).items():
            param.copy_(weights[name].to(param.device, param.dtype))


def advance_schedule(runtime: Any, steps: int) -> None:
    """Move the lr schedule ``steps`` steps on (a warm start continues the first half's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "scheduler.step() before optimizer.step()"
        for _ in range(steps):
            runtime.scheduler.step()


class Log:
    """The logger the plug-ins talk to: keeps rounds and warnings, prints nothing."""

    def __init__(self, clock: SimClock):
        self.clock, self.rounds, self.warnings, self.publishes = clock, [], [], 0

    def log(self, event: str, payload: dict[str, Any]) -> None:
        if event == "diloco_round":
            self.rounds.append({"time": self.clock.now, **payload})
        elif event == "diloco_publish":
            self.publishes += 1

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def notice(self, message: str) -> None:
        pass


class SimClock:
    """Simulated seconds, the master's clock for ``max_wait_s``."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class Evaluator:
    """Held-out loss of given weights: an eval model and the configured ``EvalPlugin``."""

    def __init__(self, scale: Scale, corpus: str, out_dir: str, seed: int):
        config = make_config(scale, corpus, out_dir, seed, scale.eval_batch, 1, scale.eval_batches)
        self.runtime = build_runtime(config, console=False)
        self.batches = (scale.eval_batches, scale.final_eval_batches)
        self.final = False  # the final evaluation uses more held-out batches
        plugins = [p for p in self.runtime.trainer.plugins if isinstance(p, EvalPlugin)]
        if not plugins:
            raise SpeedtronicError("no EvalPlugin: the corpus has no held-out tail")
        self.plugin = plugins[0]
        self.reference = snapshot(parameters_of(self.runtime.model))  # seed's initial weights
        self.cache: tuple[int, float] | None = None

    def loss(self, weights: dict[str, torch.Tensor]) -> float:
        load_weights(self.runtime.model, weights)
        self.plugin.batches = self.batches[self.final]
        return float(self.plugin.evaluate(self.runtime.trainer)["eval_loss"])

    def global_loss(self, transport: LocalTransport) -> tuple[int, float]:
        """Read, validate and evaluate the published global (cached per outer step)."""
        counted = transport.read_step_count()
        cached = self.cache is not None and counted and counted["outer_step"] == self.cache[0]
        if cached and not self.final:
            return self.cache
        data = transport.read(GLOBAL_WEIGHTS, expected_delta_bytes(self.reference, "fp32") + 2**20)
        outer_step, weights = decode_weights(data, self.reference)
        self.cache = (outer_step, self.loss(weights))
        return self.cache


# ---------------------------------------------------------------------- one job


class Job:
    """One (arm, seed) run; ``run()`` returns its result record."""

    def __init__(self, arm: Arm, seed: int, scale: Scale, corpus: str, tmp: Path):
        self.arm, self.seed, self.scale, self.corpus, self.tmp = arm, seed, scale, corpus, tmp
        self.block_tokens = scale.batch * scale.seq_len  # one worker step
        self.curve: list[list[float]] = []
        self.next_eval = 0
        self.final_loss: float | None = None
        self.status = "completed"

    def run(self) -> dict[str, Any]:
        start = time.perf_counter()
        scale, arm = self.scale, self.arm
        self.evaluator = Evaluator(scale, self.corpus, str(self.tmp / "eval"), self.seed)
        initial = self.evaluator.reference
        self.prefix = scale.steps // 2 if arm.warm else 0
        if arm.warm:
            initial = self._warm_start(initial)
        self.steps = scale.steps - self.prefix
        nominal = 1 if arm.kind == "single" else scale.workers
        self.eval_tokens = scale.eval_every * self.block_tokens * nominal
        extra: dict[str, Any] = {}
        try:
            if arm.kind == "diloco":
                extra = self._diloco(initial)
            else:
                extra = self._single(initial)
        except (SpeedtronicError, BadDelta) as exc:  # e.g. non-finite steps: diverged
            self.status = f"failed: {str(exc).splitlines()[0][:200]}"
        params = count_parameters(self.evaluator.runtime.model)
        finals = [p[1] for p in self.curve]
        final = self.final_loss
        return {
            "arm": arm.name,
            "base": arm.base,
            "start": "warm" if arm.warm else "cold",
            "seed": self.seed,
            "kind": arm.kind,
            "status": self.status,
            "policy": arm.policy,
            "reset_inner": arm.reset_inner,
            "delta_dtype": arm.delta_dtype,
            "params": params,
            "prefix_steps": self.prefix,
            "curve": self.curve,  # [tokens since start (all workers), eval loss, outer step, time]
            "initial_eval_loss": finals[0] if finals else None,
            "final_eval_loss": final,
            "min_eval_loss": min(_finite(finals), default=None),
            "rise_after_warmup": rise_after_warmup(self.curve),
            "wall_s": time.perf_counter() - start,
            **extra,
        }

    # -- evaluation points ------------------------------------------------------------

    def _maybe_eval(self, tokens: int, sim_time: float, loss_fn, final: bool = False) -> None:
        if not final and tokens < self.next_eval:
            return
        if final and self.curve and self.curve[-1][0] == tokens:
            self.curve.pop()  # re-evaluate: the final round may have changed the global
        outer_step, loss = loss_fn()
        self.curve.append([tokens, loss if math.isfinite(loss) else None, outer_step, sim_time])
        while self.next_eval <= tokens:
            self.next_eval += self.eval_tokens
        if final and self.scale.final_eval_batches == self.scale.eval_batches:
            self.final_loss = self.curve[-1][1]
        elif final:  # the reported number: the same weights on more held-out batches
            self.evaluator.final = True
            loss = loss_fn()[1]
            self.evaluator.final = False
            self.final_loss = loss if math.isfinite(loss) else None

    # -- warm start ---------------------------------------------------------------------

    def _warm_start(self, initial: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Worker 0 (arm a's data order and schedule) trains the first half; its weights."""
        key = (self.seed, self.scale)
        if key in _WARM_CACHE:
            return _WARM_CACHE[key]
        runtime = self._runtime(0, self.scale.batch, self.scale.steps, "warmstart")
        load_weights(runtime.model, initial)
        runtime.model.train()
        for _ in range(self.prefix):
            runtime.trainer.train_step()
        weights = snapshot(parameters_of(runtime.model))
        _WARM_CACHE[key] = weights
        return weights

    def _runtime(self, worker: int, batch: int, horizon: int, name: str) -> Any:
        config = make_config(
            self.scale,
            self.corpus,
            str(self.tmp / name),
            data_seed(self.seed, worker),
            batch,
            horizon,
        )
        return build_runtime(config, console=False)

    def _continue_warm(self, runtime: Any, worker: int, batch: int) -> None:
        """After a warm start: the schedule goes on from the prefix's last step, and worker 0
        (whose data order the warm-start run read) skips the blocks that run trained on."""
        advance_schedule(runtime, self.prefix)
        if worker == 0 and self.prefix:
            for _ in range(-(-self.prefix * self.scale.batch // batch)):
                next(runtime.trainer.data)

    # -- a and b: one Trainer ---------------------------------------------------------

    def _single(self, initial: dict[str, torch.Tensor]) -> dict[str, Any]:
        scale = self.scale
        batch = scale.batch * (scale.workers if self.arm.kind == "dp" else 1)
        runtime = self._runtime(0, batch, self.prefix + self.steps, "single")
        load_weights(runtime.model, initial)
        self._continue_warm(runtime, 0, batch)
        runtime.model.train()
        trainer = runtime.trainer

        def loss_fn() -> tuple[int, float]:
            return trainer.step, self.evaluator.loss(snapshot(parameters_of(runtime.model)))

        self._maybe_eval(0, 0.0, loss_fn)
        for _ in range(self.steps):
            trainer.train_step()
            self._maybe_eval(trainer.tokens, trainer.step * scale.step_seconds, loss_fn)
        self._maybe_eval(trainer.tokens, trainer.step * scale.step_seconds, loss_fn, final=True)
        workers = scale.workers if self.arm.kind == "dp" else 1
        return {
            "workers": workers,
            "speeds": [1.0] * workers,
            "steps_per_worker": [self.steps],
            "tokens": trainer.tokens,
            "skipped_steps": trainer.skipped_steps,
            "bytes": self._bytes(workers, 0, 0),
        }

    # -- c, d, e: DumbDiLoCo ----------------------------------------------------------

    def _planned_steps(self) -> tuple[list[int], list[float]]:
        scale, n = self.scale, self.scale.workers
        if not self.arm.uneven:
            return [self.steps] * n, [1.0] * n
        speeds = list(scale.speeds)
        if len(speeds) != n:
            raise ValueError(f"--speeds needs {n} values")
        if scale.uneven_budget == "fastest":
            return [int(self.steps * s / max(speeds)) for s in speeds], speeds
        # Same simulated wall clock for all, same total tokens as the equal arms.
        total = n * self.steps
        exact = [total * s / sum(speeds) for s in speeds]
        planned = [int(x) for x in exact]
        by_remainder = sorted(range(n), key=lambda i: exact[i] - planned[i], reverse=True)
        for i in by_remainder[: total - sum(planned)]:
            planned[i] += 1
        return planned, speeds

    def _diloco(self, initial: dict[str, torch.Tensor]) -> dict[str, Any]:
        scale, arm = self.scale, self.arm
        planned, speeds = self._planned_steps()
        clock = SimClock()
        log = Log(clock)
        transport = LocalTransport(self.tmp / "repo")
        policy = {("outer_policy" if k == "policy" else k): v for k, v in arm.policy.items()}
        settings = SimpleNamespace(
            **policy,
            poll_interval=scale.master_poll or 1.0,
            inner_steps=scale.inner_steps,
            reset_inner_optimizer=arm.reset_inner,
            reapply_own_delta=arm.reapply_own,
            sync_wait_s=3600.0 if arm.sync else 0.0,  # the event loop below models the wait
            delta_dtype=arm.delta_dtype,
            upload_timeout_s=1.0,
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loop = MasterLoop(
                settings,
                {k: t.clone() for k, t in initial.items()},
                transport,
                log,
                self.tmp / "master_state",
                clock=clock.monotonic,
            )
            loop.start()  # publishes the initial global (outer step 0)
            nodes = []
            for i, steps in enumerate(planned):
                worker_settings = SimpleNamespace(**vars(settings), node_id=f"worker-{i}")
                runtime = self._runtime(i, scale.batch, self.prefix + steps, f"worker-{i}")
                self._continue_warm(runtime, i, scale.batch)
                plugin = WorkerPlugin(
                    worker_settings, runtime.model, transport, log, background=False
                )
                runtime.model.train()
                plugin.on_train_start(runtime.trainer)  # installs the published global
                if not all(
                    torch.equal(p.detach().cpu(), initial[k])
                    for k, p in parameters_of(runtime.model).items()
                ):
                    raise SpeedtronicError(f"worker {i} did not install the initial global")
                step_s = scale.step_seconds / speeds[i]
                nodes.append(
                    SimpleNamespace(runtime=runtime, plugin=plugin, planned=steps, step_s=step_s)
                )
            self._simulate(nodes, loop, transport, clock)
            messages = [str(w.message) for w in caught]
        rounds = log.rounds
        delta_up = sum(n.plugin.counters["bytes_up"] for n in nodes)
        global_down = sum(n.plugin.counters["bytes_down"] for n in nodes)
        return {
            "workers": len(nodes),
            "speeds": speeds,
            "steps_per_worker": planned,
            "tokens": sum(n.runtime.trainer.tokens for n in nodes),
            "skipped_steps": sum(n.runtime.trainer.skipped_steps for n in nodes),
            "outer_steps": loop.master.outer_step,
            "rounds": {
                "count": len(rounds),
                "with_momentum": sum(1 for r in rounds if r.get("momentum")),
                "deltas_per_round": loop.counters["included"] / max(1, len(rounds)),
                **{k: loop.counters[k] for k in ("found", "included", "rejected", "stale")},
            },
            "uploads": sum(n.plugin.counters["uploads"] for n in nodes),
            "sim_seconds": clock.now,
            "warnings": sorted(set(log.warnings + messages))[:10],
            "bytes": self._bytes(len(nodes), delta_up, global_down),
        }

    def _simulate(
        self, nodes: list, loop: MasterLoop, transport: LocalTransport, clock: SimClock
    ) -> None:
        """The event loop: the worker whose step ends next acts (module docstring)."""
        interval = self.scale.master_poll if self.arm.master_poll is None else self.arm.master_poll
        next_poll = interval
        events = [(node.step_s, i) for i, node in enumerate(nodes)]
        heapq.heapify(events)
        waiting: list[int] = []  # sync reference arms: workers blocked at a boundary

        def tokens() -> int:
            return sum(node.runtime.trainer.tokens for node in nodes)

        def loss_fn() -> tuple[int, float]:
            return self.evaluator.global_loss(transport)

        def poll(force: bool = False) -> None:
            if loop.poll_once(force=force) is not None and waiting:
                for j in waiting:  # the round includes their deltas: install it, go on
                    nodes[j].plugin.fetcher.refresh()
                    nodes[j].plugin.install_ready(nodes[j].runtime.trainer)
                    heapq.heappush(events, (clock.now + nodes[j].step_s, j))
                waiting.clear()

        self._maybe_eval(0, 0.0, loss_fn)
        while events or waiting:
            if not events:  # blocked workers and no quorum: the master's timer would fire
                poll(force=True)
                continue
            now, i = heapq.heappop(events)
            while interval > 0 and next_poll <= now:
                clock.now = next_poll
                poll()
                next_poll += interval
            clock.now = now
            node = nodes[i]
            trainer, plugin = node.runtime.trainer, node.plugin
            last = trainer.step + 1 >= node.planned
            if last or trainer.step + 1 - plugin.boundary_step >= self.scale.inner_steps:
                plugin.fetcher.refresh()  # the poller has the newest global by the boundary
            uploads = plugin.counters["uploads"]
            trainer.train_step()
            plugin.after_optimizer_step(trainer)
            if last:
                plugin.on_train_end(trainer, None)
            elif self.arm.sync and plugin.boundary_step == trainer.step:
                waiting.append(i)
            else:
                heapq.heappush(events, (now + node.step_s, i))
            plugin.uploader.send_pending()
            if interval == 0 and plugin.counters["uploads"] > uploads:
                poll()
            self._maybe_eval(tokens(), now, loss_fn)
        poll(force=True)  # the master's final round: what arrived at the end
        self._maybe_eval(tokens(), clock.now, loss_fn, final=True)

    def _bytes(self, workers: int, delta_up: int, global_down: int) -> dict[str, Any]:
        """Traffic per worker vs a ring all-reduce of fp32 gradients for the same tokens."""
        params = count_parameters(self.evaluator.runtime.model)
        n = self.scale.workers
        allreduce = 2 * params * 4 * self.steps * (n - 1) / n  # sent per worker, arm b
        per_worker = (delta_up + global_down) / workers if delta_up else 0
        return {
            "delta_up": delta_up,
            "global_down": global_down,
            "per_worker": per_worker,
            "allreduce_per_worker": allreduce,
            "allreduce_over_diloco": allreduce / per_worker if per_worker else None,
        }


_WARM_CACHE: dict[tuple[int, Scale], dict[str, torch.Tensor]] = {}


def rise_after_warmup(curve: list[list[float]], warmup_share: float = 0.2) -> float | None:
    """Largest relative rise of eval loss above the best earlier point, after the first 20%."""
    points = [(t, loss) for t, loss, *_ in curve]
    if not points or any(loss is None for _, loss in points):
        return None
    end, best, rise = points[-1][0], math.inf, 0.0
    for tokens, loss in points:
        if tokens >= warmup_share * end and best < math.inf:
            rise = max(rise, loss / best - 1.0)
        best = min(best, loss)
    return rise


def run_job(arm_name: str, seed: int, scale: Scale, corpus: str) -> dict[str, Any]:
    arm = parse_arm(arm_name)
    with tempfile.TemporaryDirectory(prefix="speedtronic-diloco-") as tmp:
        result = Job(arm, seed, scale, corpus, Path(tmp)).run()
    return result


# ---------------------------------------------------------------------- many jobs


def run_all(
    arms: list[str], seeds: list[int], scale: Scale, args: argparse.Namespace, corpus: str
) -> list[dict[str, Any]]:
    plan = [(arm, seed) for arm in arms for seed in seeds]
    if args.jobs <= 1:
        results = []
        for k, (arm, seed) in enumerate(plan, 1):
            result = run_job(arm, seed, scale, corpus)
            _progress(k, len(plan), result)
            results.append(result)
        return results
    plan.sort(key=lambda job: job_cost(parse_arm(job[0]), scale), reverse=True)
    results: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="speedtronic-diloco-jobs-") as tmp,
        ThreadPoolExecutor(max_workers=args.jobs) as pool,
    ):
        futures = [
            pool.submit(_subprocess_job, arm, seed, scale, corpus, Path(tmp) / f"job{k}")
            for k, (arm, seed) in enumerate(plan)
        ]
        for k, future in enumerate(as_completed(futures), 1):
            result = future.result()
            _progress(k, len(plan), result)
            results.append(result)
    order = {job: k for k, job in enumerate((a, s) for a in arms for s in seeds)}
    return sorted(results, key=lambda r: order[(r["arm"], r["seed"])])


def _subprocess_job(arm: str, seed: int, scale: Scale, corpus: str, stem: Path) -> dict:
    spec = {"arm": arm, "seed": seed, "scale": asdict(scale), "corpus": corpus}
    out = stem.with_suffix(".json")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--job",
        json.dumps(spec),
        "--job-out",
        str(out),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {
            "arm": arm,
            "seed": seed,
            "base": arm.split(":")[0],
            "start": "warm" if arm.endswith(":warm") else "cold",
            "status": "error: " + " | ".join(tail),
            "curve": [],
            "final_eval_loss": None,
        }
    return json.loads(out.read_text())


def _progress(k: int, total: int, result: dict[str, Any]) -> None:
    final = result.get("final_eval_loss")
    text = f"{final:.4f}" if isinstance(final, float) and math.isfinite(final) else "-"
    print(
        f"[{k}/{total}] {result['arm']} seed {result['seed']}: final eval loss {text} "
        f"({result.get('wall_s', 0):.0f} s, {result['status']})",
        file=sys.stderr,
        flush=True,
    )


# ---------------------------------------------------------------------- summary


def _finite(values: list[Any]) -> list[float]:
    return [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault(r["arm"], []).append(r)
    rows = []
    for arm, runs in groups.items():
        finals = [r.get("final_eval_loss") for r in runs]
        ok = _finite(finals)
        rises = [r.get("rise_after_warmup") for r in runs]
        row = {
            "arm": arm,
            "base": runs[0]["base"],
            "start": runs[0]["start"],
            "seeds": [r["seed"] for r in runs],
            "finals": finals,
            "final": statistics.mean(ok) if len(ok) == len(runs) and ok else None,
            "rise": max(_finite(rises)) if len(_finite(rises)) == len(runs) else None,
            "status": sorted({r["status"] for r in runs}),
        }
        bytes_ = [
            r["bytes"]["allreduce_over_diloco"]
            for r in runs
            if r.get("bytes", {}).get("allreduce_over_diloco")
        ]
        row["allreduce_over_diloco"] = statistics.mean(bytes_) if bytes_ else None
        rounds = [r["rounds"] for r in runs if "rounds" in r]
        if rounds:
            row["rounds"] = statistics.mean(x["count"] for x in rounds)
            row["stale"] = statistics.mean(x["stale"] for x in rounds)
            row["rejected"] = statistics.mean(x["rejected"] for x in rounds)
        rows.append(row)
    for row in rows:  # relative to a and c of the same start
        for ref in ("a", "c"):
            other = next((x for x in rows if x["base"] == ref and x["start"] == row["start"]), None)
            ok = other and other["final"] and row["final"]
            row[f"vs_{ref}_pct"] = 100 * (row["final"] / other["final"] - 1) if ok else None
    return rows


def check_targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 8's targets, per start (cold and warm), for the arms that ran."""
    out: dict[str, Any] = {}
    for start in ("cold", "warm"):
        get = {r["base"]: r for r in rows if r["start"] == start and r["final"] is not None}
        if "a" not in get:
            continue
        a, checks = get["a"]["final"], {}
        if "c" in get:
            checks["c_not_worse_than_a"] = get["c"]["final"] <= a
        # every DumbDiLoCo setting of 4 equal workers, sync_wait_s (the _sync arms) included
        sweep = [r for b, r in get.items() if b.startswith("c")]
        if sweep:
            best = min(sweep, key=lambda r: r["final"])
            checks["best_c"] = best["arm"]
            checks["best_c_3pct_below_a"] = best["final"] <= 0.97 * a
        if "d" in get and "c" in get:
            checks["d_within_1pct_of_c"] = get["d"]["final"] <= 1.01 * get["c"]["final"]
            checks["d_stable"] = get["d"]["rise"] is not None and get["d"]["rise"] <= STABLE_RISE
        if "d" in get:
            e = next((r for r in rows if r["start"] == start and r["base"] == "e"), None)
            if e is not None:
                worse = e["final"] is None or e["final"] > 1.01 * get["d"]["final"]
                checks["e_worse_than_d"] = worse
        out[start] = checks
    return out


def print_table(rows: list[dict[str, Any]], targets: dict[str, Any]) -> None:
    head = (
        f"{'arm':<30}{'start':<6}{'final eval (per seed)':<28}{'mean':>8}{'vs a':>8}"
        f"{'vs c':>8}{'rise':>9}{'rounds':>7}{'stale':>6}{'AR/DiLoCo':>10}  status"
    )
    print(head)
    print("-" * len(head))

    def pct(v: Any) -> str:
        return f"{v:+.1f}%" if isinstance(v, float) else "-"

    for r in rows:
        seeds = ", ".join(
            f"{v:.4f}" if isinstance(v, float) and math.isfinite(v) else "nan" for v in r["finals"]
        )
        mean = f"{r['final']:.4f}" if r["final"] is not None else "-"
        rise = f"{100 * r['rise']:.1f}%" if r["rise"] is not None else "-"
        rounds = f"{r['rounds']:.0f}" if "rounds" in r else "-"
        stale = f"{r['stale']:.0f}" if "stale" in r else "-"
        ratio = f"{r['allreduce_over_diloco']:.0f}x" if r["allreduce_over_diloco"] else "-"
        print(
            f"{r['arm']:<30}{r['start']:<6}{seeds:<28}{mean:>8}{pct(r['vs_a_pct']):>8}"
            f"{pct(r['vs_c_pct']):>8}{rise:>9}{rounds:>7}{stale:>6}{ratio:>10}  "
            f"{','.join(r['status'])}"
        )
    for start, checks in targets.items():
        print(f"targets ({start}): " + ", ".join(f"{k}={v}" for k, v in checks.items()))


# ---------------------------------------------------------------------- plot

COLORS = {
    "a": "#7f7f7f",
    "b": "#000000",
    "c": "#1f77b4",
    "c4": "#17becf",
    "c4_sync": "#ff7f0e",
    "c4_sync_keep": "#9467bd",
    "d": "#2ca02c",
    "e": "#d62728",
}


def plot(report: dict[str, Any], png: str) -> None:
    """Eval loss against tokens, one panel per start, and a panel of every arm's final loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results, rows = report["results"], report["summary"]
    starts = [s for s in ("cold", "warm") if any(r["start"] == s for r in results)]
    fig, axes = plt.subplots(
        1, len(starts) + 1, figsize=(6.5 * (len(starts) + 1), 5.5), squeeze=False
    )
    seeds = len({r["seed"] for r in results})
    for ax, start in zip(axes[0], starts, strict=False):
        mine = [r for r in rows if r["start"] == start]
        sweep = [r for r in mine if r["base"].startswith("c_") and r["final"] is not None]
        best = min(sweep, key=lambda r: r["final"])["base"] if sweep else None
        extra = {best: "#9467bd", "c_lr1.0_m0": "#8c564b", "d_lr0.5_m0": "#006400"}
        low, high = math.inf, 0.0
        for row in mine:
            color = COLORS.get(row["base"]) or extra.get(row["base"])
            runs = [r for r in results if r["arm"] == row["arm"] and r["curve"]]
            if color is None or not runs:
                continue
            xs, ys = _mean_curve(runs)
            final = f"{row['final']:.3f}" if row["final"] is not None else "failed"
            style = "--" if row["base"] in extra else "-"
            ax.plot(
                [x / 1e6 for x in xs],
                [math.nan if y is None else y for y in ys],
                style,
                color=color,
                lw=1.6,
                label=f"{row['base']}: {_label(row['base'], runs[0])} -> {final}",
            )
            finite = [y for y in ys if y is not None and math.isfinite(y)]
            low = min([low, *finite])
            if row["base"] == "a" and len(finite) > 2:
                high = max(high, finite[2])
        ax.set_ylim(low - 0.05, max(high, low + 0.5))
        ax.set_xlabel(
            "tokens trained, all workers (millions)"
            + (", from the warm start" if start == "warm" else "")
        )
        ax.set_ylabel("held-out eval loss of the global weights")
        ax.set_title(f"{start} start, mean of {seeds} seed(s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6.5, loc="upper right")
    ax = axes[0][-1]
    finals = [r for r in rows if r["final"] is not None]
    ref = {r["start"]: r["final"] for r in finals if r["base"] == "a"}
    labels = [r["arm"] for r in finals]
    values = [r["final"] for r in finals]
    colors = ["#1f77b4" if r["start"] == "cold" else "#ff7f0e" for r in finals]
    ax.barh(range(len(values)), values, color=colors)
    for y, r in enumerate(finals):
        if r["start"] in ref:
            ax.plot([ref[r["start"]]] * 2, [y - 0.4, y + 0.4], color="k", lw=1)
    ax.set_yticks(range(len(values)), labels, fontsize=7)
    ax.invert_yaxis()
    low = min(values, default=1.0)
    ax.set_xlim(low - 0.1, low * 1.5)
    ax.set_xlabel("final eval loss (bars past the edge are worse; black tick: arm a)")
    ax.set_title("every arm (blue cold, orange warm)")
    scale = report["scale"]
    fig.suptitle(
        "DumbDiLoCo at tiny scale: 0.43M-param decoder, byte-level stdlib sources, "
        f"{scale['steps']} inner steps/worker, H={scale['inner_steps']}"
    )
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}", file=sys.stderr)


def _mean_curve(runs: list[dict[str, Any]]) -> tuple[list[float], list[float | None]]:
    grids = [[p[0] for p in r["curve"]] for r in runs]
    if any(g != grids[0] for g in grids):
        runs = runs[:1]  # different eval points: show the first seed
    xs = [p[0] for p in runs[0]["curve"]]
    ys = []
    for k in range(len(xs)):
        values = [r["curve"][k][1] for r in runs]
        ys.append(statistics.mean(values) if all(v is not None for v in values) else None)
    return xs, ys


def _label(base: str, run: dict[str, Any]) -> str:
    names = {
        "a": "1 worker",
        "b": "data parallel, 4x batch",
        "c4_sync": "sync_wait_s: synchronous DiLoCo",
        "c4_sync_keep": "sync_wait_s, inner AdamW kept (recommended)",
        "e": "uneven, naive async",
    }
    if base in names:
        return names[base]
    policy = run.get("policy", {})
    who = "uneven" if base.startswith("d") else "4 workers"
    return (
        f"{who}, lr {policy.get('outer_lr')} mom {policy.get('outer_momentum')} "
        f"min_deltas {policy.get('min_deltas')}"
    )


# ---------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--arms",
        default="all",
        help="comma list: a,b,c,c4,d,e,sweep,c_lr1.0_m0,d:warm,... or all (default)",
    )
    p.add_argument("--seeds", help="comma list (default 0,1; --quick: 0)")
    p.add_argument("--out", help="write the results JSON here")
    p.add_argument("--jobs", type=int, default=1, help="parallel subprocesses (1 thread each)")
    p.add_argument("--threads", type=int, help="torch threads in-process (default: torch's)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, seed 0: checks it runs")
    p.add_argument("--steps", type=int, help="inner steps per worker (600)")
    p.add_argument("--inner-steps", type=int, help="H, steps between syncs (50)")
    p.add_argument("--batch", type=int, help="sequences per worker step (16)")
    p.add_argument("--seq-len", type=int, help="(64)")
    p.add_argument("--d-model", type=int, help="(128)")
    p.add_argument("--layers", type=int, help="(2)")
    p.add_argument("--lr", type=float, help="inner AdamW peak lr (3e-3)")
    p.add_argument("--eval-every", type=int, help="steps per worker between evals (50)")
    p.add_argument("--eval-batches", type=int, help="held-out batches of 128 sequences (8)")
    p.add_argument("--final-eval-batches", type=int, help="for the final number (8)")
    p.add_argument("--speeds", help="uneven workers' speeds (1,1.3,2.6,5.7)")
    p.add_argument("--uneven-budget", choices=["tokens", "fastest"])
    p.add_argument("--step-seconds", type=float, help="simulated s per step at speed 1 (1.0)")
    p.add_argument(
        "--master-poll",
        type=float,
        help="simulated s between master polls; 0 = after every upload (default)",
    )
    p.add_argument("--device", help="(cpu)")
    p.add_argument("--corpus", help="a UTF-8 text file instead of the stdlib sources")
    p.add_argument("--plot", metavar="RESULTS_JSON", help="only plot a results file")
    p.add_argument("--png", help="write the plot here")
    p.add_argument("--job", help=argparse.SUPPRESS)
    p.add_argument("--job-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    return args


def build_scale(args: argparse.Namespace) -> Scale:
    values: dict[str, Any] = dict(QUICK) if args.quick else {}
    for key, attr in [
        ("steps", "steps"),
        ("inner_steps", "inner_steps"),
        ("batch", "batch"),
        ("seq_len", "seq_len"),
        ("d_model", "d_model"),
        ("n_layer", "layers"),
        ("lr", "lr"),
        ("eval_every", "eval_every"),
        ("eval_batches", "eval_batches"),
        ("uneven_budget", "uneven_budget"),
        ("final_eval_batches", "final_eval_batches"),
        ("master_poll", "master_poll"),
        ("device", "device"),
        ("step_seconds", "step_seconds"),
    ]:
        if getattr(args, attr) is not None:
            values[key] = getattr(args, attr)
    if args.speeds:
        values["speeds"] = tuple(float(s) for s in args.speeds.split(","))
    return Scale(**values)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.job:  # one job in a subprocess of --jobs
        torch.set_num_threads(1)
        spec = json.loads(args.job)
        scale = Scale(**{**spec["scale"], "speeds": tuple(spec["scale"]["speeds"])})
        result = run_job(spec["arm"], spec["seed"], scale, spec["corpus"])
        Path(args.job_out).write_text(json.dumps(result))
        return 0
    if args.plot:
        plot(json.loads(Path(args.plot).read_text()), args.png or "diloco_convergence.png")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    scale = build_scale(args)
    arms = expand_arms(args.arms)
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1")).split(",")]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="speedtronic-diloco-corpus-") as tmp:
        corpus = args.corpus or str(Path(tmp) / "stdlib.txt")
        if not args.corpus:
            size = write_stdlib_corpus(Path(corpus))
            print(
                f"corpus: {size / 1e6:.1f} MB of Python stdlib source; {len(arms)} arms x "
                f"{len(seeds)} seeds, {args.jobs} at a time",
                file=sys.stderr,
                flush=True,
            )
        results = run_all(arms, seeds, scale, args, corpus)
    rows = summarize(results)
    targets = check_targets(rows)
    report = {
        "benchmark": "diloco_convergence",
        "scale": asdict(scale),
        "arms": arms,
        "seeds": seeds,
        "wall_s": time.perf_counter() - start,
        "threads": torch.get_num_threads() if args.jobs == 1 else 1,
        "jobs": args.jobs,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "summary": rows,
        "targets": targets,
        "results": results,
    }
    print_table(rows, targets)
    print(f"wall time {report['wall_s']:.0f} s", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    if args.png:
        plot(report, args.png)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Data parallelism inside one machine: DistributedDataParallel under ``torchrun``.

Owns the process group (joined from torchrun's RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT, gloo on CPU and NCCL on CUDA, each rank on ``cuda:LOCAL_RANK``,
with ``run.group_timeout_s`` so a dead rank cannot hang the others) and ``GroupHooks``, the
Trainer's ``parallel`` hooks and plug-in: loss weights over the global batch (the averaged
gradient equals one process's gradient of the same global batch), ``no_sync`` on non-final
micro-steps, one loss / label count / stop request agreed by every rank each step (so the
non-finite guard and Ctrl-C decide the same everywhere), and each rank's RNG and data
position gathered into rank 0's checkpoint. Nothing here runs in a single process: the
trainer's hooks stay ``None`` and it pays nothing.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import inspect
import os
import signal
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from speedtronic.errors import ConfigError, TrainingError
from speedtronic.train.rng import set_rng_state

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class World:
    """Where this process sits in its group; ``size == 1`` outside torchrun."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def world_from_env(environ: Any = None) -> World:
    """The torchrun environment as a World; a value that is not an integer is a one-line error."""
    environ = os.environ if environ is None else environ
    values = {}
    for key in _ENV:
        text = environ.get(key, "1" if key == "WORLD_SIZE" else "0")
        if not text.isdigit():
            raise ConfigError(f"{key}: must be a non-negative integer (got {text[:40]!r})")
        values[key] = int(text)
    world = World(values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"])
    if world.size < 1 or world.rank >= world.size:
        raise ConfigError(f"RANK: {world.rank} must be below WORLD_SIZE={world.size}")
    return world


def is_main_process() -> bool:
    """True outside torchrun and on rank 0 (what prints, logs and writes files)."""
    return os.environ.get("RANK", "0") in ("", "0")


def start_group(world: World, device: torch.device, timeout_s: float) -> torch.device:
    """Join the group (once per process); returns this rank's device."""
    if device.type == "cuda":
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    elif device.type != "cpu":
        raise ConfigError(f"run.device: DDP runs on cuda or cpu (got {device.type})")
    if not dist.is_initialized():
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
        if missing:
            raise ConfigError(f"{missing[0]}: not set; launch with torchrun --nproc-per-node N")
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            rank=world.rank,
            world_size=world.size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        _CREATED.append(True)
    return device


_CREATED: list[bool] = []  # whether start_group made the group (a caller's is left alone)


def owns_group() -> bool:
    """Whether this process made the group it is in (and so ends it)."""
    return bool(_CREATED) and dist.is_initialized()


def end_group() -> None:
    """Leave the group this process made. The group object itself lives on in the DDP
    wrapper's reducer; collecting it here, not at interpreter exit, matters: gloo's threads
    dying during finalization abort the process (SIGABRT after a successful run)."""
    if owns_group():
        dist.destroy_process_group()
        _CREATED.clear()
        gc.collect()


def wrap_model(
    model: nn.Module, device: torch.device, find_unused: bool = False
) -> DistributedDataParallel:
    """DDP over ``model``: gradients averaged across ranks in buckets during backward.

    Buffers are not re-broadcast every forward (every rank builds them identically from
    the same seed); models with running statistics keep them per rank. ``find_unused``:
    DDP looks for parameters the step's graph did not reach (``run.find_unused_parameters``).
    """
    # torch >= 2.13 renames the option (and warns about the old name)
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    buffers = "forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers"
    return DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=True,
        find_unused_parameters=find_unused,
        **{buffers: False},
    )


def explain(exc: RuntimeError) -> TrainingError | None:
    """DDP's error for parameters that got no gradient, as one line naming the config key."""
    if "find_unused_parameters=True" not in str(exc):
        return None
    return TrainingError(
        "the model has parameters that got no gradient in a step, which DDP refuses by "
        "default: set run.find_unused_parameters: true (or use every parameter in the loss)"
    )


def sum_across(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed over every rank of the group (every rank must call this)."""
    dist.all_reduce(tensor)
    return tensor


class GroupHooks:
    """The Trainer's ``parallel`` hooks and a plug-in (signals, rank state in checkpoints)."""

    name = "ddp"

    def __init__(self, world: World, ddp: DistributedDataParallel, logger: Any):
        self.world, self.ddp, self.logger = world, ddp, logger
        self._labelled: torch.Tensor | None = None
        self._stop: torch.Tensor | None = None  # the agreed stop flag of the latest step
        self._pending: int | None = None  # a signal seen here, not yet agreed
        self._previous: dict[int, Any] = {}
        self._restored = False

    @property
    def is_main(self) -> bool:
        return self.world.is_main

    # ---- the step ----------------------------------------------------------------------
    def loss_weights(self, micro: list[Any], counts: list[torch.Tensor] | None) -> list[Any]:
        """Each micro-batch's share of the global mean loss, times the world size.

        DDP averages gradients over ranks; weighting by label counts over the *global* batch
        (one all-reduce of a scalar) makes that average the single-process gradient.
        """
        if counts is None:
            self._labelled = None
            return [1.0 / len(micro)] * len(micro)
        total = torch.stack(counts).sum()
        dist.all_reduce(total)
        self._labelled = total
        scale = total.clamp(min=1) / self.world.size
        return [c / scale for c in counts]

    def micro_step(self, last: bool) -> Any:
        return contextlib.nullcontext() if last else self.ddp.no_sync()

    def agree(self, total: torch.Tensor, counts: Any) -> tuple[torch.Tensor, Any]:
        """The global mean loss and label count, and whether any rank was asked to stop."""
        pending = 1.0 if self._pending is not None else 0.0
        packed = torch.stack([total.double(), torch.full_like(total, pending, dtype=torch.double)])
        dist.all_reduce(packed)  # NaN anywhere stays NaN: the guard skips on every rank
        self._stop = packed[1]
        labelled = [self._labelled] if self._labelled is not None else None
        return (packed[0] / self.world.size).to(total.dtype), labelled

    # ---- plug-in -----------------------------------------------------------------------
    def on_train_start(self, trainer: Any) -> None:
        if trainer.step and not self._restored:  # resumed from a single-process checkpoint
            self._rederive_position(trainer, 1)
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._pending is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self._pending = signum  # acted on when every rank has agreed, at the next step

    def after_optimizer_step(self, trainer: Any) -> None:
        # The step's host read is done: this reads an already computed value.
        if self._stop is not None and float(self._stop) > 0 and trainer._stop_signal is None:
            trainer.request_stop(self._pending or signal.SIGTERM)
            self.logger.notice(
                "stop requested: every rank stops after this step "
                "(press Ctrl-C again to abort at once)"
            )

    def restore_signals(self) -> None:
        """After the run, final checkpoint included (a signal during it must not kill the
        save, as in one process): the handlers from before training."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    # ---- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every rank's RNG and data position, gathered on rank 0 (a collective: all ranks
        call it, inside the trainer's state_dict of a checkpoint save)."""
        from speedtronic.train.rng import rng_state

        data = self._data_state()
        mine = {"rng": rng_state(), "data": data}
        gathered: list[Any] | None = [None] * self.world.size if self.is_main else None
        dist.gather_object(mine, gathered, dst=0)
        return {"world_size": self.world.size, "ranks": gathered or []}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ranks, saved_world = state["ranks"], int(state["world_size"])
        self._restored = True
        own = ranks[min(self.world.rank, len(ranks) - 1)]
        set_rng_state(own["rng"])
        if saved_world == self.world.size:
            if own["data"] is not None and self.trainer_data is not None:
                self.trainer_data.load_state_dict(own["data"])
            return
        self._rederive_position(None, saved_world, ranks[0]["data"])

    trainer_data: Any = None  # the trainer's DataStream, set by attach()

    def _data_state(self) -> Any:
        data = self.trainer_data
        return data.state_dict() if data is not None and hasattr(data, "state_dict") else None

    def _rederive_position(self, trainer: Any, saved_world: int, saved: Any = None) -> None:
        """Another world size: the same global position, split over this many ranks."""
        data = self.trainer_data
        saved = saved if saved is not None else data.state_dict()
        batch = saved["batch"] * saved_world // self.world.size
        data.load_state_dict({"epoch": saved["epoch"], "batch": batch})
        self.logger.notice(
            f"ddp: the checkpoint was written by {saved_world} rank(s), this run has "
            f"{self.world.size}; data position re-derived (epoch {saved['epoch']}, "
            f"batch {batch} per rank) and RNG streams taken from the saved ranks"
        )

    # ---- rank 0 writes, the others wait --------------------------------------------------
    def saved(self) -> None:
        """After rank 0 wrote a checkpoint: nobody goes on (or exits) before it is complete."""
        dist.barrier()


class FromGroup:
    """In a single process: resumes a checkpoint of a DDP group (its data position re-derived).

    Only ``load_state_dict``: it adds nothing to a step, and writes nothing into checkpoints.
    """

    name = "ddp"

    def __init__(self, data: Any, logger: Any):
        self.data, self.logger = data, logger

    def load_state_dict(self, state: dict[str, Any]) -> None:
        hooks = GroupHooks(World(), None, self.logger)  # type: ignore[arg-type]
        hooks.trainer_data = self.data
        hooks.load_state_dict(state)


EAGER_LOOKS = 8  # a DDP node looks for an eager install this many times an inner loop


class NodeSync:
    """DumbDiLoCo with DDP: one node = one group, and only rank 0 runs the node's plug-ins
    (transport, uploads, polls, master work; the pseudo-gradient once per node).

    At start and at every boundary (every ``inner_steps``, which every rank counts) rank 0 says,
    in one broadcast of a scalar, which global outer step its weights come from; when that
    changed, it broadcasts the weights it installed and every other rank resets its inner
    optimizer as rank 0 did. With eager installs rank 0's worker may install only every
    ``every`` steps (``EAGER_LOOKS`` times an inner loop), where all ranks look too: always
    between optimizer steps, never inside one. Otherwise nothing, not even a host sync. Placed
    after the DiLoCo plug-ins and before the checkpoint one.
    """

    name = "ddp_node"

    def __init__(self, world: World, model: nn.Module, settings: Any, device: Any):
        self.world, self.model, self.device = world, model, device
        self.reset, self.inner_steps = settings.reset_inner_optimizer, settings.inner_steps
        self.eager = settings.install == "eager"
        self.every = max(1, self.inner_steps // EAGER_LOOKS)  # steps between eager looks
        self.worker: Any = None  # rank 0: the node's WorkerPlugin
        self.outer_step = -2  # the installed global's outer step as rank 0 last announced it
        self.boundary = 0  # the step of the last boundary: rank 0's worker's, from the start

    def on_train_start(self, trainer: Any) -> None:
        # Rank 0's worker keeps the boundary (its checkpoint's, also one saved by a single
        # process): every rank counts from it, so all look for installs on the same steps
        start = self.worker.boundary_step if self.worker is not None else trainer.step
        boundary = torch.tensor([start], dtype=torch.int64, device=self.device)
        dist.broadcast(boundary, src=0)
        self.boundary = int(boundary.item())
        self._follow(trainer, at_start=True)

    def after_optimizer_step(self, trainer: Any) -> None:
        since = trainer.step - self.boundary
        if since >= self.inner_steps:
            self.boundary = trainer.step
            self._follow(trainer, at_start=False)
        elif self.eager and since % self.every == 0:  # rank 0 may have installed eagerly
            self._follow(trainer, at_start=False)

    def _follow(self, trainer: Any, at_start: bool) -> None:
        installed = self.worker.base_outer_step if self.worker is not None else 0
        announced = torch.tensor([installed], dtype=torch.int64, device=self.device)
        dist.broadcast(announced, src=0)
        outer_step = int(announced.item())
        if outer_step == self.outer_step:
            return
        self.outer_step = outer_step
        with torch.no_grad():
            for tensor in [*self.model.parameters(), *self.model.buffers()]:
                dist.broadcast(tensor, src=0)
        if not self.world.is_main and self.reset and not at_start:
            trainer.optimizer.state.clear()  # as rank 0's worker did when it installed

    def state_dict(self) -> dict[str, Any]:
        return {"outer_step": self.outer_step}  # the boundary is rank 0's worker's

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.outer_step = int(state["outer_step"])


def node_plugins(
    config: Any,
    world: World,
    model: nn.Module,
    device: Any,
    logger: Any,
    tokenizer: Any = None,
    adapters: Any = None,
) -> list:
    """The DumbDiLoCo plug-ins of this rank: rank 0's own, then the node's sync on all;
    ``tokenizer``: the run's, for the final global's record; ``adapters``: a LoRA run's."""
    if not config.distributed.train_locally:
        raise ConfigError(
            "distributed.train_locally: false trains nothing; launch such a master without "
            "torchrun (one process)"
        )
    # Other ranks wait in a collective while rank 0 waits on the repo: it must stay shorter
    waits = max(config.distributed.sync_wait_s, config.distributed.upload_timeout_s)
    if waits + 5 >= config.run.group_timeout_s:
        raise ConfigError(
            f"run.group_timeout_s: {config.run.group_timeout_s:g} s must exceed "
            f"distributed.sync_wait_s / upload_timeout_s ({waits:g} s) by 5 s in a DDP group"
        )
    sync = NodeSync(world, model, config.distributed, device)
    if not world.is_main:
        return [sync]  # no transport here: only rank 0 talks to the repo
    from speedtronic.distributed.setup import coordinator_plugins

    plugins = coordinator_plugins(config, model, logger, tokenizer, adapters)
    sync.worker = next((p for p in plugins if p.name == "diloco"), None)
    # The run's end on rank 0 (the master's drain, the worker's wait for its global) must end
    # while the other ranks wait for its checkpoint save
    end_cap = max(1.0, config.run.group_timeout_s - config.distributed.upload_timeout_s - 10)
    for plugin in plugins:
        if plugin.name == "diloco_master":
            plugin.drain_cap_s = end_cap
    if sync.worker is not None:
        sync.worker.end.wait_cap_s = end_cap
    if sync.worker is not None:  # it installs eagerly only where the other ranks look
        sync.worker.install_every = sync.every
    return [*plugins, sync]


def attach(trainer: Any, world: World, logger: Any) -> GroupHooks:
    """Make ``trainer`` (built over a DDP model) one rank of the group."""
    hooks = GroupHooks(world, trainer.model, logger)
    hooks.trainer_data = trainer.data
    trainer.parallel, trainer.world = hooks, world.size
    trainer.plugins.insert(0, hooks)
    return hooks

"""Helpers for the DDP tests: run a config on N CPU ranks (gloo), spawned with
torch.multiprocessing, each rank reporting its losses and checkpoint into a directory."""

from __future__ import annotations

import gc
import json
import os
import socket
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp
from checkpoint.test_resume import StopAt


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DieAt:
    """Kills its rank at a step, as a crash or an OOM would."""

    name = "die_at"

    def __init__(self, rank: int, step: int):
        self.rank, self.step = rank, step

    def after_optimizer_step(self, trainer):
        if trainer.step == self.step and int(os.environ["RANK"]) == self.rank:
            os._exit(3)


class Spy:
    """Records the rank's plug-ins and a checksum of its weights when training ends."""

    name = "spy"

    def __init__(self):
        self.plugins, self.checksum = [], None
        self.checksums: dict[int, float] = {}  # step -> weights after it (before installs)

    def after_optimizer_step(self, trainer):
        if self.every and trainer.step % self.every == 0:
            self.checksums[trainer.step] = float(
                sum(p.detach().double().sum() for p in trainer.params)
            )

    every = 0  # > 0: a checksum every that many steps

    def on_train_end(self, trainer, result):
        self.plugins = [p.name for p in trainer.plugins]
        self.checksum = float(sum(p.detach().double().sum() for p in trainer.params))


def with_unused_branch(**params: Any) -> Any:
    """The reference model plus a layer its loss never uses (a skipped branch, as in MoE)."""
    import torch

    from speedtronic.registry import build_model

    model = build_model("reference_transformer", params)
    model.unused_branch = torch.nn.Linear(4, 4)
    return model


def ddp_objects(cls: type) -> int:
    return sum(isinstance(o, cls) for o in gc.get_objects())


def _rank_main(rank: int, world: int, port: int, config: dict, out: str, extra: dict) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    from speedtronic.runtime import train_from_config

    losses: dict[int, float] = {}
    evals: dict[int, tuple[float, int]] = {}
    notices: list[str] = []
    installs: list[int] = []  # steps of eager installs (rank 0)

    def record(event, payload):
        if event == "train_step":
            losses[payload["step"]] = payload["loss"]
        elif event == "eval":
            evals[payload["step"]] = (payload["eval_loss"], payload["eval_tokens"])
        elif event in ("notice", "warning"):
            notices.append(payload["message"])
        elif event == "diloco_install":
            installs.append(payload["step"])

    spy = Spy()
    spy.every = extra.get("checksum_every", 0)
    plugins: list[Any] = [spy]
    if extra.get("stop_at"):
        plugins.append(StopAt(extra["stop_at"]))
    if extra.get("die_at"):
        plugins.append(DieAt(*extra["die_at"]))
    try:
        result = train_from_config(config, console=False, hooks=[record], plugins=plugins)
    except Exception as exc:
        if not extra.get("report_errors"):
            raise
        # the error as this rank's report, for the test to read (spawn keeps only the first)
        report = {"error": repr(exc), "ddp_alive": ddp_objects(DistributedDataParallel)}
        Path(out, f"rank{rank}.json").write_text(json.dumps(report))
        return
    # A wrapper still alive now would take gloo's threads into interpreter shutdown (SIGABRT)
    ddp_alive = ddp_objects(DistributedDataParallel)
    report = {
        "ddp_alive": ddp_alive,
        "losses": losses,
        "evals": evals,
        "notices": notices,
        "steps": result.steps,
        "tokens": result.tokens,
        "status": result.status,
        "checkpoint": result.checkpoint,
        "plugins": spy.plugins,
        "checksum": spy.checksum,
        "checksums": spy.checksums,
        "installs": installs,
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))


def run_ranks(config: dict, world: int, out: Path, **extra: Any) -> list[dict]:
    """Train ``config`` on ``world`` CPU ranks; each rank's report (losses, steps, ...)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rank*.json"):
        old.unlink()
    args = (world, free_port(), config, str(out), extra)
    mp.spawn(_rank_main, args=args, nprocs=world, join=True)
    return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]

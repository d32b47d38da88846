"""A DumbDiLoCo fleet in one process, for the end-of-run tests of every transport (I6).

``Fleet`` runs a training master (``MasterPlugin`` with its own ``WorkerPlugin``) and workers
(``WorkerPlugin``, each in a thread of its own) on fake trainers over the transports a test's
harness makes: the real plug-ins, threads and transports, only the training is a fake (weights
moved by known amounts, one optimizer step every ``step_s`` seconds). What a test asserts is
what a user reads: the final ``global/step_count.json``, each node's final line, and the final
global in its output directory.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import torch
from diloco.test_nodes import FakeTrainer, model
from diloco_support import Log, settings

from speedtronic.distributed.final_global import FinalGlobalWriter
from speedtronic.distributed.master.loop import MasterLoop
from speedtronic.distributed.master.plugin import MasterPlugin, serve
from speedtronic.distributed.worker.plugin import WorkerPlugin

FLEET = dict(
    inner_steps=2,
    poll_interval=0.05,
    min_deltas=1,
    max_wait_s=0.0,
    install="eager",
    upload_timeout_s=30.0,
    drain_timeout_s=30.0,  # the end waits this long at most: a failing test ends
    announce=True,
    min_publish_interval_s=0.0,
)


class Node:
    """One node's plug-ins, fake trainer and thread."""

    def __init__(self, name: str, plugins: list[Any], trainer: FakeTrainer, log: Log):
        self.name, self.plugins, self.trainer, self.log = name, plugins, trainer, log
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    @property
    def worker(self) -> WorkerPlugin:
        return next(p for p in self.plugins if isinstance(p, WorkerPlugin))

    def run(self, steps: int, step_s: float, end: bool, go: threading.Event | None) -> None:
        """Train ``steps`` optimizer steps (once ``go`` is set), then end the run (``end``) as
        the Trainer does."""
        try:
            for plugin in self.plugins:
                plugin.on_train_start(self.trainer)
            if go is not None:
                go.wait(60)
            for _ in range(steps):
                time.sleep(step_s)
                self.trainer.train_step(_Both(self.plugins), move=-0.01)
            if end:
                for plugin in self.plugins:
                    plugin.on_train_end(self.trainer, None)
        except BaseException as exc:  # noqa: BLE001 - re-raised by join()
            self.error = exc

    def start(self, steps: int, step_s: float, end: bool = True, go=None) -> Node:
        """``end=False``: a node that dies after ``steps`` (its run was to go on)."""
        self.trainer.options.max_steps = steps if end else 10 * steps
        args = (steps, step_s, end, go)
        self.thread = threading.Thread(target=self.run, args=args, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        """A node that dies: its threads stop, nothing more is sent."""
        self.worker.status.stop.set()
        self.worker.uploader.wake.set()

    def join(self, timeout: float = 120.0) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{self.name} did not end: {self.log.warnings}"
        if self.error is not None:
            raise self.error

    def lines(self) -> list[str]:
        return [m for m in self.log.warnings + self.log.notices]


class _Both:
    """What FakeTrainer.train_step calls: every plug-in's after_optimizer_step."""

    def __init__(self, plugins: list[Any]):
        self.plugins = plugins

    def after_optimizer_step(self, trainer: Any) -> None:
        for plugin in self.plugins:
            plugin.after_optimizer_step(trainer)


class NoticeLog(Log):
    """A Log that also keeps notices (the final lines are notices when all is well)."""

    def __init__(self):
        super().__init__()
        self.notices: list[str] = []

    def notice(self, message):
        self.notices.append(message)


class SlowUploads:
    """A transport whose uploads take ``delay_s`` (a slow link): everything else as is."""

    def __init__(self, transport: Any, delay_s: float):
        self.transport, self.delay_s = transport, delay_s

    def upload(self, path: str, data: bytes) -> None:
        time.sleep(self.delay_s)
        self.transport.upload(path, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def worker(repo: Any, name: str, tmp_path: Path, upload_s: float = 0.0, **overrides) -> Node:
    net, log = model(1.0), NoticeLog()
    config = settings(node_id=name, **{**FLEET, **overrides})
    transport = repo.transport(name)
    transport = SlowUploads(transport, upload_s) if upload_s else transport
    plugin = WorkerPlugin(config, net, transport, log, spill_dir=tmp_path / name)
    plugin.end.final_writer = FinalGlobalWriter(net, tmp_path / name, {}, {"node_id": name})
    return Node(name, [plugin], FakeTrainer(net), log)


def master_loop(repo: Any, tmp_path: Path, log: Log, **overrides) -> MasterLoop:
    config = settings(node_id="master", **{**FLEET, **overrides})
    weights = {"weight": torch.ones(1, 2)}
    return MasterLoop(config, weights, repo.transport("master"), log, tmp_path / "state")


def training_master(repo: Any, tmp_path: Path, **overrides) -> Node:
    """A master that trains too: its MasterPlugin first, then its own WorkerPlugin."""
    own = worker(repo, "master", tmp_path, **overrides)
    loop = master_loop(repo, tmp_path, own.log, **overrides)
    plugin = MasterPlugin(loop, own.worker)
    plugin.stragglers = False  # the tests start every node before the master ends
    plugin.final_writer = FinalGlobalWriter(own.trainer.net, tmp_path / "master", {}, {})
    own.plugins.insert(0, plugin)
    return own


def coordinating_master(repo: Any, tmp_path: Path, outer_steps: int, **overrides):
    """``serve`` in a thread: returns (thread, log, result holder)."""
    log = NoticeLog()
    loop = master_loop(repo, tmp_path, log, **overrides)
    writer = FinalGlobalWriter(model(1.0), tmp_path / "master", {}, {})
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            loop.start()
            result["path"] = serve(loop, outer_steps, threading.Event(), writer)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, log, result


def step_count(repo: Any) -> dict:
    return repo.transport("reader").read_step_count()


def announced(repo: Any, names: list[str]) -> bool:
    """Whether every one of these nodes has said its run began (``nodes/<id>/node.json``)."""
    from speedtronic.distributed.protocol import ANNOUNCEMENT, announced_node

    refs = repo.transport("reader").list_deltas()
    return set(names) <= {announced_node(r.path) for r in refs if r.problem == ANNOUNCEMENT}


def assert_every_last_delta_counted(repo: Any, nodes: list[Node]) -> dict:
    """The user's assertion: the final step_count.json names every node's last delta."""
    counted = step_count(repo)["nodes"]
    for node in nodes:
        last = node.worker.uploader.final_seq
        entry = counted.get(node.name) or {}
        assert last is not None and entry.get("seq") == last and entry.get("final"), (
            node.name,
            last,
            counted,
            node.lines(),
        )
    return counted

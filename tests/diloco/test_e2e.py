"""DumbDiLoCo end to end: a master and two workers as separate ``speedtronic train`` processes.

They share only a directory. The master only coordinates (``train_locally: false``) and ends
by itself once every worker's last delta is in (I6): outer steps advance, each worker installs
new globals, consumed deltas are gone, the published global's loss is below the initial
weights' loss, and every node leaves the final global in its output directory.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import proc_support
import pytest
import torch
import yaml

from speedtronic.distributed.codec import decode_weights
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, STEP_COUNT

CONFIG = {
    "run": {"seed": 0, "device": "cpu"},
    "model": {
        "name": "reference_transformer",
        "vocab_size": 64,
        "seq_len": 32,
        "n_layer": 1,
        "n_head": 2,
        "d_model": 32,
    },
    "data": {"micro_batch_size": 8},
    "optimizer": {"lr": 1e-2},
    "scheduler": {"warmup_steps": 2},
    "logging": {"every_steps": 10},
    "distributed": {
        "enabled": True,
        "inner_steps": 5,
        "poll_interval": 0.1,
        "min_deltas": 2,
        "max_wait_s": 1.0,
        "delta_dtype": "fp32",
    },
}


def start(tmp_path: Path, repo: Path, role: str, node: str, steps: int, **more) -> subprocess.Popen:
    config = {**CONFIG, "run": {**CONFIG["run"], "name": node, "max_steps": steps}}
    config["distributed"] = {
        **CONFIG["distributed"],
        "role": role,
        "node_id": node,
        "repo_id": str(repo),
        "outer_steps": 10_000,
        **more,
    }
    path = tmp_path / f"{node}.yaml"
    path.write_text(yaml.safe_dump(config))
    log = open(tmp_path / f"{node}.log", "w")  # noqa: SIM115 - closed with the process
    env = proc_support.quiet_env()  # one thread each: three processes on two cores
    command = [
        sys.executable,
        "-m",
        "speedtronic",
        "train",
        "-c",
        str(path),
        "--output-dir",
        str(tmp_path / node),
    ]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)


def global_loss(weights: dict[str, torch.Tensor]) -> float:
    from speedtronic.config import SpeedtronicConfig
    from speedtronic.data import SyntheticTokens
    from speedtronic.registry import build_model

    cfg = SpeedtronicConfig.from_dict({k: v for k, v in CONFIG.items() if k != "distributed"})
    model = build_model(cfg.model.name, cfg.model.params)
    # Parameters only (tied weights once): buffers and the tied head come from the model.
    assert not model.load_state_dict(weights, strict=False).unexpected_keys
    data = SyntheticTokens(64, 32, seed=0)
    batch = [data[i] for i in range(10_000, 10_064)]
    ids, labels = (torch.stack([b[k] for b in batch]) for k in ("input_ids", "labels"))
    with torch.no_grad():
        return float(model(ids, labels=labels))


@pytest.mark.slow
def test_a_master_and_two_workers_train_one_model_through_a_directory(tmp_path):
    repo = tmp_path / "repo"
    master = start(tmp_path, repo, "master", "master", steps=1, train_locally=False)
    published = wait_until(lambda: (repo / GLOBAL_WEIGHTS).exists(), watch=master)
    assert published, log_of(tmp_path, "master")
    initial = decode_weights((repo / GLOBAL_WEIGHTS).read_bytes(), _reference())[1]
    workers = [start(tmp_path, repo, "worker", f"worker-{i}", steps=100) for i in (1, 2)]
    for i, process in enumerate(workers, 1):
        assert proc_support.wait(process) == 0, log_of(tmp_path, f"worker-{i}")
    assert proc_support.wait(master) == 0, log_of(tmp_path, "master")  # the run ended: it ends
    summary = json.loads((tmp_path / "master" / "summary.json").read_text())  # a run too
    assert (summary["status"], summary["role"], summary["steps"]) == ("completed", "master", 0)
    assert not (tmp_path / "master" / ".running").exists()
    assert not list(repo.glob("nodes/*/delta_*.safetensors")), log_of(tmp_path, "master")
    step, final = decode_weights((repo / GLOBAL_WEIGHTS).read_bytes(), _reference())
    assert_run_ended_whole(tmp_path, repo, ["worker-1", "worker-2"], ["master"])
    assert step >= 2, log_of(tmp_path, "master")
    for name in ("worker-1", "worker-2"):
        full = (tmp_path / f"{name}.log").read_text()  # the summary block ends it: read it all
        assert installs(full), log_of(tmp_path, name)
    assert global_loss(final) < global_loss(initial) - 0.2  # learnt, through the global


def assert_run_ended_whole(tmp_path: Path, repo: Path | None, workers: list, others: list) -> dict:
    """I6 as a user sees it: the final step_count.json holds every worker's last delta (the
    step it trained to), each says so, and every node left the final global in its output dir
    as a checkpoint ``ckpt inspect`` reads."""
    from speedtronic.checkpoint.inspection import inspect_path

    counted = json.loads((repo / STEP_COUNT).read_text()) if repo is not None else None
    for node in workers:
        if counted is not None:
            entry = counted["nodes"][node]
            assert entry["final"] and entry["end_step"] > 0, (node, counted)
        assert "holds this node's last delta" in log_of(tmp_path, node), log_of(tmp_path, node)
    for node in [*workers, *others]:
        report = inspect_path(tmp_path / node / "final_global")
        [checkpoint] = report["checkpoints"]
        assert checkpoint["status"] == "unverified" and checkpoint["step"] >= 1, report
    return counted


def wait_until(condition, timeout: float = 60.0, watch: subprocess.Popen | None = None) -> bool:
    """Whether ``condition()`` came true. With ``watch``, no clock: wait while that process
    runs and shows progress (``proc_support``), so a loaded machine only makes it slower;
    without, for ``timeout`` seconds (for in-process conditions)."""
    progress = proc_support.Progress(watch) if watch is not None else None
    deadline = time.monotonic() + timeout
    while not condition():
        if progress is None and time.monotonic() > deadline:
            return False
        if progress is not None and (watch.poll() is not None or progress.stalled()):
            return condition()
        time.sleep(0.05)
    return True


def installs(log: str) -> int:
    """Globals a worker's log says it installed: eagerly (the default) or at a boundary."""
    return log.count("diloco install at step") + log.count("installed global")


def log_of(tmp_path: Path, node: str) -> str:
    return (tmp_path / f"{node}.log").read_text()[-3000:]


def _reference() -> dict[str, torch.Tensor]:
    from speedtronic.config import SpeedtronicConfig
    from speedtronic.distributed.worker.plugin import parameters_of, snapshot
    from speedtronic.registry import build_model

    cfg = SpeedtronicConfig.from_dict({k: v for k, v in CONFIG.items() if k != "distributed"})
    return snapshot(parameters_of(build_model(cfg.model.name, cfg.model.params)))


def master_first_run(tmp_path: Path, start_node, has_global, repo: Path | None = None) -> dict:
    """Issue 26's first case: a training master and two workers, equal max_steps (40), the
    master started first and finishing first, publish pacing at its default (60 s). Every
    process must exit 0 and the final global must hold every node's last delta."""
    master = start_node(tmp_path, "master", "master", 40)
    assert wait_until(has_global, watch=master), log_of(tmp_path, "master")
    workers = [start_node(tmp_path, "worker", f"worker-{i}", 40) for i in (1, 2)]
    for i, process in enumerate(workers, 1):
        assert proc_support.wait(process) == 0, log_of(tmp_path, f"worker-{i}")
    assert proc_support.wait(master) == 0, log_of(tmp_path, "master")
    [line] = [t for t in log_of(tmp_path, "master").splitlines() if "final global" in t]
    every = r"holds every node's last delta: master seq \d+, worker-1 seq \d+, worker-2 seq \d+"
    assert re.search(every + r"; written to .*master/final_global$", line), line
    for node in ("master", "worker-1", "worker-2"):
        assert "Traceback" not in (tmp_path / f"{node}.log").read_text()
    return assert_run_ended_whole(tmp_path, repo, ["worker-1", "worker-2"], ["master"])


@pytest.mark.slow
def test_I6_a_master_finishing_first_ends_with_every_nodes_last_delta_on_a_directory(tmp_path):
    repo = tmp_path / "repo"

    def start_node(tmp_path, role, node, steps):
        return start(tmp_path, repo, role, node, steps, min_publish_interval_s=60.0)

    counted = master_first_run(tmp_path, start_node, (repo / GLOBAL_WEIGHTS).exists, repo)
    assert counted["nodes"]["master"]["final"], counted


@pytest.mark.slow
def test_I6_a_worker_ending_after_the_master_leaves_the_runs_final_global_with_true_numbers(
    tmp_path,
):
    """Issue 36: the worker's final_global was outer step 2, the master's 4; its meta.json said
    tokens '-' and the card 'optimizer steps 3' for 2 x 30 trained steps. `storage pull` fetches
    the run's final global into a node's output dir later."""
    from speedtronic.checkpoint import load_checkpoint
    from speedtronic.checkpoint.inspection import inspect_path

    repo = tmp_path / "repo"
    master = start(tmp_path, repo, "master", "master", steps=20, min_deltas=1)
    assert wait_until(lambda: (repo / GLOBAL_WEIGHTS).exists(), watch=master)
    worker = start(tmp_path, repo, "worker", "worker-1", steps=30, min_deltas=1)
    assert proc_support.wait(master) == 0, log_of(tmp_path, "master")
    assert proc_support.wait(worker) == 0, log_of(tmp_path, "worker-1")
    counted = json.loads((repo / STEP_COUNT).read_text())
    ours = load_checkpoint(tmp_path / "worker-1" / "final_global")
    theirs = load_checkpoint(tmp_path / "master" / "final_global")
    assert ours.meta["step"] == theirs.meta["step"] == counted["outer_step"]
    for name, tensor in theirs.model_state.items():
        assert torch.equal(ours.model_state[name], tensor), name
    assert "the run's final global" in log_of(tmp_path, "worker-1")
    trained = [load_checkpoint(tmp_path / n / "checkpoints" / f"step_{s:010d}") for n, s in
               (("master", 20), ("worker-1", 30))]  # fmt: skip
    assert ours.meta["optimizer_steps"] == 50, counted  # every delta applied: 20 + 30
    assert ours.meta["tokens"] == sum(c.meta["tokens"] for c in trained)
    [entry] = inspect_path(tmp_path / "worker-1" / "final_global")["checkpoints"]
    assert entry["tokens"] == ours.meta["tokens"]

    (tmp_path / "worker-1" / "final_global" / "meta.json").unlink()  # as if never fetched
    pulled = proc_support.run(
        [sys.executable, "-m", "speedtronic", "storage", "pull", str(tmp_path / "worker-1")],
        env=proc_support.quiet_env(),
    )
    assert pulled.returncode == 0, pulled.stderr
    assert f"the run's final global: outer step {counted['outer_step']}" in pulled.stdout
    again = load_checkpoint(tmp_path / "worker-1" / "final_global")
    assert again.meta["optimizer_steps"] == 50
    for name, tensor in theirs.model_state.items():
        assert torch.equal(again.model_state[name], tensor), name

"""DDP under torchrun's environment, on CPU with gloo and 2 spawned ranks.

A 2-rank run must be the single-process run with the same global batch (weights after N
steps, losses per step); every rank reads its own share of the data (no duplicate, no
missing sample); a 2-rank resume is exact; only rank 0 reports and writes.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import proc_support
import pytest
import torch
from ddp_support import free_port, run_ranks
from torch.utils.data import IterableDataset

from speedtronic.checkpoint import load_checkpoint
from speedtronic.config import SpeedtronicConfig
from speedtronic.data.loader import EveryNth, ResumableSampler, shard_iterable
from speedtronic.data.sources import TokenizedTextStream
from speedtronic.errors import ConfigError
from speedtronic.runtime import train_from_config


@pytest.fixture
def ddp_config(tiny):
    config = copy.deepcopy(tiny)
    config["data"] = {"micro_batch_size": 2, "target_batch_size": 8}
    config["run"]["max_steps"] = 4
    return config


def weights(path):
    return load_checkpoint(path).model_state


def assert_close_weights(a, b, tol=1e-5):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=tol, atol=tol, msg=key)


def single_process(config, event="train_step"):
    """The run's result, and each step's loss (or, for ``eval``, its eval loss and tokens)."""
    logged = {}

    def record(name, payload):
        if name == event == "train_step":
            logged[str(payload["step"])] = payload["loss"]
        elif name == event == "eval":
            logged[str(payload["step"])] = [payload["eval_loss"], payload["eval_tokens"]]

    return train_from_config(config, console=False, hooks=[record]), logged


@pytest.mark.slow
def test_two_ranks_equal_one_process_with_the_same_global_batch(ddp_config, tmp_path):
    single, single_losses = single_process(ddp_config)
    config = copy.deepcopy(ddp_config)
    config["run"]["output_dir"] = str(tmp_path / "ddp")
    rank0, rank1 = run_ranks(config, 2, tmp_path / "reports")
    assert rank0["steps"] == rank1["steps"] == 4
    assert rank0["tokens"] == single.tokens  # the global count, not one rank's
    assert rank0["losses"].keys() == single_losses.keys()
    for step, loss in single_losses.items():
        assert rank0["losses"][step] == pytest.approx(loss, rel=1e-5)
    assert rank1["losses"] == {}  # only rank 0 reports
    assert rank0["ddp_alive"] == rank1["ddp_alive"] == 0  # the group is gone before exit
    assert_close_weights(weights(single.checkpoint), weights(rank0["checkpoint"]))


@pytest.mark.slow
def test_ranks_share_the_evaluation_and_report_the_single_process_figure(ddp_config, tmp_path):
    """3 eval batches on 2 ranks (2 + 1): summed across ranks, the same loss and token count."""
    text = tmp_path / "corpus.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps {i % 7}\n" for i in range(2000)))
    ddp_config["model"]["vocab_size"] = 256
    ddp_config["data"].update(text_path=str(text), eval_fraction=0.1, eval_every=2)
    ddp_config["data"]["eval_batches"] = 3
    _, single = single_process(ddp_config, "eval")
    ddp_config["run"]["output_dir"] = str(tmp_path / "ddp")
    rank0, _ = run_ranks(ddp_config, 2, tmp_path / "reports")
    assert single.keys() == rank0["evals"].keys() == {"2", "4"}
    for step, (loss, tokens) in single.items():
        assert rank0["evals"][step] == [pytest.approx(loss, rel=1e-5), tokens]


def test_a_rank_evaluates_every_nth_batch_and_sums_with_the_others():
    import contextlib
    from types import SimpleNamespace

    from speedtronic.evaluate.loss_plugin import EvalPlugin

    class Loss(torch.nn.Module):
        seen: list[int] = []

        def forward(self, value):  # a batch is one number: its loss, and its id
            self.seen.append(int(value))
            return value.float().mean()

    precision = SimpleNamespace(device=torch.device("cpu"), autocast=contextlib.nullcontext)
    logger = SimpleNamespace(log=lambda event, payload: None)
    trainer = SimpleNamespace(model=Loss(), precision=precision, logger=logger, step=1)
    batches = [torch.tensor([float(i)]) for i in range(7)]
    others = torch.tensor([0 + 3 + 2, 3.0])  # ranks 0 and 2: batches 0, 3 and 2 (sum, count)
    plugin = EvalPlugin(batches, 1, 5, shard=(1, 3), sum_across=lambda t: t + others)
    assert plugin.evaluate(trainer)["eval_loss"] == 2.0  # the mean of batches 0..4
    assert Loss.seen == [1, 4]


@pytest.mark.slow
def test_a_parameter_without_gradient_names_run_find_unused_parameters(ddp_config, tmp_path):
    ddp_config["model"]["name"] = "ddp_support:with_unused_branch"
    ddp_config["run"]["output_dir"] = str(tmp_path / "refused")
    refused = run_ranks(ddp_config, 2, tmp_path / "refused-reports", report_errors=True)
    assert all("set run.find_unused_parameters: true" in r["error"] for r in refused), refused
    assert [r["ddp_alive"] for r in refused] == [0, 0]  # a failed rank frees its group too
    ddp_config["run"].update(find_unused_parameters=True, output_dir=str(tmp_path / "found"))
    found = run_ranks(ddp_config, 2, tmp_path / "found-reports")
    assert [r["steps"] for r in found] == [4, 4]


def test_accumulation_is_derived_from_the_global_batch(ddp_config, monkeypatch):
    cfg = SpeedtronicConfig.load(ddp_config)
    assert [cfg.accumulation_for(w) for w in (1, 2, 4)] == [4, 2, 1]
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert (cfg.accumulation_steps, cfg.batch_size) == (2, 8)
    with pytest.raises(ConfigError, match=r"micro_batch_size x world size = 2 x 8 = 16"):
        cfg.accumulation_for(8)


@pytest.mark.parametrize("shuffle", [False, True])
def test_map_style_sharding_has_no_duplicate_and_no_missing_sample(shuffle):
    length, world, micro = 40, 2, 2
    shares = [list(ResumableSampler(length, shuffle, 7, rank, world)) for rank in range(world)]
    everything = sorted(i for share in shares for i in share)
    assert everything == list(range(length))
    # One optimizer step of the group holds exactly a single process's step.
    single = list(ResumableSampler(length, shuffle, 7))
    accumulation = 2
    per_rank = micro * accumulation
    for step in range(length // (per_rank * world)):
        group = {i for s in shares for i in s[step * per_rank : (step + 1) * per_rank]}
        step_size = per_rank * world
        assert group == set(single[step * step_size : (step + 1) * step_size])


def test_uneven_length_drops_the_same_tail_on_every_rank():
    shares = [list(ResumableSampler(41, True, 3, rank, 2)) for rank in range(2)]
    assert len(shares[0]) == len(shares[1]) == 20
    assert not set(shares[0]) & set(shares[1])


def test_text_stream_sharding_splits_segments(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"line {i} of the corpus\n" for i in range(3000)), encoding="utf-8")

    def blocks(rank, world):
        stream = TokenizedTextStream(path, 8, lambda s: list(s.encode()), segment_bytes=4096)
        shard_iterable(stream, rank, world)
        return [tuple(b["input_ids"].tolist()) for b in stream]

    whole = sorted(blocks(0, 1))
    parts = [blocks(r, 2) for r in range(2)]
    assert parts[0] and parts[1]
    assert sorted(parts[0] + parts[1]) == whole


class Counting(IterableDataset):
    def __iter__(self):
        return iter(range(10))

    def state_dict(self):
        return {"ok": 1}


def test_user_iterables_are_read_every_nth_and_keep_their_state():
    parts = [shard_iterable(Counting(), r, 3) for r in range(3)]
    assert all(isinstance(p, EveryNth) for p in parts)
    assert sorted(i for p in parts for i in p) == list(range(10))
    assert parts[0].state_dict() == {"inner": {"ok": 1}, "mid": True}


class Positioned(torch.utils.data.IterableDataset):
    """Resumes from the count of items it yielded (the documented contract)."""

    def __init__(self):
        self.pos = 0

    def __iter__(self):
        while self.pos < 100:
            self.pos += 1
            yield self.pos - 1

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_a_rank_of_a_user_iterable_resumes_at_its_own_next_item(rank):
    straight = list(itertools.islice(shard_iterable(Positioned(), rank, 3), 5))
    first = shard_iterable(Positioned(), rank, 3)
    read = list(itertools.islice(iter(first), 3))
    resumed = shard_iterable(Positioned(), rank, 3)
    resumed.load_state_dict(first.state_dict())
    assert read + list(itertools.islice(iter(resumed), 2)) == straight


@pytest.mark.slow
def test_two_rank_resume_is_exact(ddp_config, tmp_path):
    ddp_config["run"]["max_steps"] = 6
    straight = run_ranks(ddp_config, 2, tmp_path / "a")[0]
    split = copy.deepcopy(ddp_config)
    split["run"]["output_dir"] = str(tmp_path / "split")
    first = run_ranks(split, 2, tmp_path / "b", stop_at=3)[0]
    assert first["status"] == "stopped" and first["steps"] == 3
    state = load_checkpoint(first["checkpoint"]).trainer_state
    assert state["plugins"]["ddp"]["world_size"] == 2
    assert len(state["plugins"]["ddp"]["ranks"]) == 2  # every rank's RNG and data position
    split["checkpoint"] = {"resume": True}
    second = run_ranks(split, 2, tmp_path / "c")[0]
    assert second["steps"] == 6 and second["tokens"] == straight["tokens"]
    assert {**first["losses"], **second["losses"]} == straight["losses"]
    a, b = weights(straight["checkpoint"]), weights(second["checkpoint"])
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.slow
def test_resume_with_another_world_size_says_so(ddp_config, tmp_path):
    ddp_config["run"]["max_steps"] = 4
    first = run_ranks(ddp_config, 2, tmp_path / "a", stop_at=2)[0]
    assert first["steps"] == 2
    ddp_config["checkpoint"] = {"resume": True}
    notices = []
    result = train_from_config(
        ddp_config,
        console=False,
        hooks=[lambda e, p: notices.append(p.get("message", "")) if e == "notice" else None],
    )
    assert result.steps == 4
    assert any("written by 2 rank(s), this run has 1" in n for n in notices)


@pytest.mark.slow
def test_diloco_node_of_two_ranks_only_rank_0_talks_to_the_repo(ddp_config, tmp_path):
    repo = tmp_path / "repo"
    ddp_config["distributed"] = {
        "enabled": True,
        "role": "master",
        "node_id": "node-a",
        "repo_id": str(repo),
        "inner_steps": 2,
        "poll_interval": 0.05,
        "min_deltas": 1,
        "max_wait_s": 0,
        "sync_wait_s": 10,
        "delta_dtype": "fp32",
        "upload_timeout_s": 10,
        "outer_lr": 0.5,  # the global differs from the node's own weights: it must travel
    }
    rank0, rank1 = run_ranks(ddp_config, 2, tmp_path / "reports")
    assert "diloco" in rank0["plugins"] and "diloco_master" in rank0["plugins"]
    assert not {"diloco", "diloco_master"} & set(rank1["plugins"])  # no transport on rank 1
    counted = json.loads((repo / "global" / "step_count.json").read_text())
    assert counted["outer_step"] >= 1  # the node's deltas reached the master
    assert rank0["checksum"] == rank1["checksum"]  # installed globals reached every rank


@pytest.mark.slow
def test_an_eager_install_lands_on_every_rank_at_the_same_step(ddp_config, tmp_path):
    """Rank 0 installs a global mid-loop only at steps where every rank looks (8 a loop), and
    broadcasts it there, between optimizer steps: the ranks' weights never differ."""
    ddp_config["run"]["max_steps"] = 40
    ddp_config["distributed"] = {
        "enabled": True,
        "role": "master",
        "node_id": "node-a",
        "repo_id": str(tmp_path / "repo"),
        "inner_steps": 16,  # eager looks every 2 steps
        "install": "eager",
        "poll_interval": 0.02,
        "min_deltas": 1,
        "max_wait_s": 0,
        "min_publish_interval_s": 0,
        "delta_dtype": "fp32",
        "outer_lr": 0.5,  # the global differs from the node's own weights: it must travel
    }
    rank0, rank1 = run_ranks(ddp_config, 2, tmp_path / "reports", checksum_every=1)
    assert rank0["checksums"] == rank1["checksums"]  # the same weights after every step
    mid_loop = [s for s in rank0["installs"] if s % 16]
    assert mid_loop and all(s % 2 == 0 for s in mid_loop), rank0["installs"]
    assert rank0["checksum"] == rank1["checksum"]


@pytest.mark.slow
def test_a_dead_rank_takes_the_group_down_within_the_timeout(ddp_config, tmp_path):
    """No launcher to kill the survivor: the group timeout and the broken link must."""
    ddp_config["run"]["group_timeout_s"] = 20
    ddp_config["run"]["max_steps"] = 50
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, str(rank), str(port), json.dumps(ddp_config)],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])},
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    # Waited for by progress, and timed from the death, not the start: on a loaded machine
    # the start-up alone can take a minute
    assert proc_support.wait(procs[1]) == 3, procs[1].stderr.read()[-2000:]  # the one that died
    died = time.monotonic()
    assert proc_support.wait(procs[0]) != 0  # the survivor did not hang...
    assert time.monotonic() - died < 5 * ddp_config["run"]["group_timeout_s"]  # ...for long
    assert procs[0].stderr.read().strip()  # and it said why


ROOT = Path(__file__).resolve().parents[2]
RANK_SCRIPT = """
import sys, json
from ddp_support import _rank_main
rank, port, config = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
_rank_main(rank, 2, port, config, ".", {"die_at": [1, 2]})  # cwd: the test's tmp_path
"""


def test_too_little_text_for_the_ranks_is_a_clear_error(tmp_path):
    from speedtronic.data.sources import TokenizedTextStream
    from speedtronic.errors import DataError

    path = tmp_path / "small.txt"
    path.write_text("hello world " * 100)  # 1.2 KB: one segment
    stream = TokenizedTextStream(path, 8, lambda text: list(text.encode()))
    with pytest.raises(DataError, match=r"data.text_path: 1 segment\(s\) of text for 2 ranks"):
        stream.set_shard(1, 2)

"""A fleet that fine-tunes (issue 56 item 4): DumbDiLoCo with ``model.lora`` on an imported Llama.

Separate ``speedtronic train`` processes share only a directory: a coordinating master and two
workers, each with ``--init-from`` the same tiny transformers Llama and ``model.lora``. The run
ends with every node's last delta in the final global; the master records the base's sha256 (the
one the LoRA start line and checkpoints name), every node's final global is a LoRA checkpoint
(the adapters, the base named); a node started on another base is refused before its first step,
in one line naming both hashes. A full-model fleet of the same model is the yardstick: the bytes
of the deltas the master read from the repo, per delta, and the published global's file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import proc_support
import pytest
import yaml
from modelout.test_import import llama_dir
from modelout_support import text_file

from diloco.test_e2e import assert_run_ended_whole, log_of, wait_until
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, STEP_COUNT

# d_model 256 and r 4 on all seven linear layers: adapters are 2r(d_in + d_out) per layer of
# d_in x d_out weights, 2.5% of this model (r 8 on a 4096-wide Llama: about 0.6%)
SIZES = dict(hidden_size=256, intermediate_size=512)
LORA = {"r": 4}


def start(tmp, repo, node, steps, base, lora=True, **more) -> subprocess.Popen:
    config = {
        "run": {"seed": 0, "device": "cpu", "max_steps": steps},
        "data": {"text_path": str(text_file(tmp)), "seq_len": 32, "micro_batch_size": 4,
                 "target_batch_size": 4},
        "optimizer": {"name": "adamw", "lr": 3e-3},
        "scheduler": {"warmup_steps": 2},
        "logging": {"every_steps": 5, "json_file": "metrics.jsonl"},
        "checkpoint": {"init_from": str(base)},
        "distributed": {"enabled": True, "inner_steps": 5, "poll_interval": 0.1,
                        "min_deltas": 2, "max_wait_s": 1.0, "delta_dtype": "fp32",
                        "node_id": node, "repo_id": str(repo), "outer_steps": 10_000, **more},
    }  # fmt: skip
    if lora:
        config["model"] = {"lora": LORA}
    path = tmp / f"{node}.yaml"
    path.write_text(yaml.safe_dump(config))
    log = open(tmp / f"{node}.log", "w")  # noqa: SIM115 - closed with the process
    command = [sys.executable, "-m", "speedtronic", "train", "-c", str(path)]
    command += ["--output-dir", str(tmp / node)]
    return subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=proc_support.quiet_env()
    )


def fleet(tmp: Path, repo: Path, base: Path, workers: list[str], lora: bool, **more) -> None:
    """A coordinating master and ``workers`` (10 steps each), run to their end, exit 0."""
    master = start(tmp, repo, "master", 1, base, lora, role="master", train_locally=False, **more)
    assert wait_until(lambda: (repo / GLOBAL_WEIGHTS).exists(), watch=master), log_of(tmp, "master")
    nodes = {name: start(tmp, repo, name, 10, base, lora) for name in workers}
    for name, process in nodes.items():
        assert proc_support.wait(process) == 0, log_of(tmp, name)
    assert proc_support.wait(master) == 0, log_of(tmp, "master")


def delta_bytes(tmp: Path) -> float:
    """Bytes per delta the master read from the repo (its last round's running totals)."""
    lines = (tmp / "master" / "metrics.jsonl").read_text().splitlines()
    rounds = [e for e in map(json.loads, lines) if e.get("event") == "diloco_round"]
    return rounds[-1]["total_downloaded_bytes"] / rounds[-1]["total_included"]


@pytest.mark.slow  # six processes, each importing a transformers model: a minute or more
def test_a_lora_fleet_ends_whole_and_sends_under_5_percent_of_a_full_fleets_bytes(tmp_path):
    base = llama_dir(tmp_path, "base", **SIZES)
    other = llama_dir(tmp_path, "other", **SIZES)  # the same shapes, other weights
    lora, full = tmp_path / "lora", tmp_path / "full"
    lora.mkdir(), full.mkdir()
    fleet(lora, lora / "repo", base, ["w1", "w2"], lora=True)
    counted = assert_run_ended_whole(lora, lora / "repo", ["w1", "w2"], ["master"])
    for node in ("master", "w1", "w2"):
        meta = json.loads((lora / node / "final_global" / "meta.json").read_text())
        assert meta["lora"]["base"]["sha256"] == counted["base_sha256"], node
    refused = start(lora, lora / "repo", "w3", 10, other)
    assert proc_support.wait(refused) == 2
    line = [x for x in log_of(lora, "w3").splitlines() if x.startswith("speedtronic: error")]
    assert len(line) == 1 and counted["base_sha256"] in line[0], log_of(lora, "w3")
    assert "this node's frozen base is sha256 " in line[0]
    assert not (lora / "repo" / "nodes" / "w3").exists()  # it sent nothing, not even hello
    fleet(full, full / "repo", base, ["w1"], lora=False, min_deltas=1)
    ratio = delta_bytes(lora) / delta_bytes(full)
    size = (lora / "repo" / GLOBAL_WEIGHTS).stat().st_size
    print(f"bytes per delta: LoRA {delta_bytes(lora):.0f}, full {delta_bytes(full):.0f}")
    assert ratio <= 0.05 and size <= 0.05 * (full / "repo" / GLOBAL_WEIGHTS).stat().st_size
    assert json.loads((full / "repo" / STEP_COUNT).read_text()).get("base_sha256") is None


def test_validate_counts_the_adapters_bytes_per_delta(tmp_path):
    from modelout_support import config_of, invoke, train

    base = train(tmp_path, "base")  # TINY: d_model 32, 1 layer, vocab 64
    config = config_of(tmp_path, "fleet")
    config["model"]["lora"] = {"r": 4, "target_modules": ["q_proj", "mlp.w_down"]}
    config["distributed"] = {"enabled": True, "repo_id": str(tmp_path / "repo"), "node_id": "a"}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(config))
    result = invoke("validate", "-c", path, "--init-from", base, "--format", "json")
    assert result.exit_code == 0, result.stderr
    facts = json.loads(result.stdout)["facts"]
    # 4 x (32 + 32) + 4 x (128 + 32) adapter parameters, 4 bytes each in fp32
    assert facts["diloco_delta_bytes"]["fp32"] == 4 * 896
    assert facts["diloco_trainable"].startswith("896 of ")

"""Tests for the checkpoint store: speedtronic.checkpoint (save/load/find) and its inspection view.

Covers the round trip (tied weights, RNG and optimizer state), latest.json, retention across
run_ids, crash safety (failed writes, damaged or incomplete checkpoints, leftover tmp dirs),
inspect/prune summaries, and the refusal to unpickle anything.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import proc_support
import pytest
import torch
from safetensors import safe_open
from torch import nn

from speedtronic.checkpoint import (
    find_latest,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from speedtronic.checkpoint import save as ckpt_save
from speedtronic.checkpoint.inspection import (
    apply_prune,
    inspect_path,
    plan_prune,
    resolve_checkpoints,
)
from speedtronic.errors import CheckpointError, ConfigError

REPO = Path(__file__).resolve().parents[2]
CONFIG = {
    "run": {"name": "smoke", "max_steps": 60},
    "model": {"name": "reference_transformer", "d_model": 8},
    "data": {"micro_batch_size": 16, "target_batch_size": 32},
    "optimizer": {"lr": 0.003},
    "precision": {"mode": "auto"},
}


class TinyLM(nn.Module):
    """Embedding tied to the LM head, as in the reference model, plus an int64 buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(16, 8)
        self.blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])
        self.norm = nn.LayerNorm(8)
        self.lm_head = nn.Linear(8, 16, bias=False)
        self.lm_head.weight = self.tok_emb.weight
        self.register_buffer("positions", torch.arange(4))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(ids)
        for block in self.blocks:
            x = x + block(x)
        return self.lm_head(self.norm(x))


def trained(seed: int = 0) -> tuple[TinyLM, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randint(0, 16, (2, 4))).sum().backward()
    opt.step()
    return model, opt


def meta(run_id: str = "run-a", **extra) -> dict:
    base = {"tokens": 1024, "samples": 8, "loss": 2.5, "run_id": run_id, "config": CONFIG}
    return {**base, "param_count": 288, **extra}


def save(root: Path, step: int, run_id: str = "run-a", keep_last: int | None = None) -> Path:
    model, opt = trained(step)
    state = {"optimizer": opt.state_dict(), "data": {"position": step}}
    return save_checkpoint(root, step, model.state_dict(), state, meta(run_id), keep_last)


def names(root: Path) -> list[str]:
    return [p.name for p in list_checkpoints(root)]


def latest_json(root: Path) -> dict:
    return json.loads((root / "latest.json").read_text())


# --------------------------------------------------------------------------- round trip


def test_round_trip_restores_model_optimizer_and_rng(tmp_path):
    model, opt = trained()
    random.seed(7)
    torch.manual_seed(7)
    state = {
        "optimizer": opt.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        "data": {"position": 123, "epoch": 1},
        "coordinator": {"outer_step": 3, "anchors": [torch.ones(2)]},
    }
    path = save_checkpoint(tmp_path, 5, model.state_dict(), state, meta())
    expected_py, expected_torch = random.random(), torch.rand(3)

    loaded = load_checkpoint(path)
    assert loaded.path == path == tmp_path / "step_0000000005"
    fresh, _ = trained(seed=99)
    fresh.load_state_dict(loaded.model_state, strict=True)
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    assert loaded.model_state["lm_head.weight"] is loaded.model_state["tok_emb.weight"]

    opt2 = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    opt2.load_state_dict(loaded.trainer_state["optimizer"])
    for index, slots in opt.state_dict()["state"].items():
        for name, value in slots.items():
            assert torch.equal(opt2.state_dict()["state"][index][name], value)

    rng = loaded.trainer_state["rng"]
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"])
    assert random.random() == expected_py
    assert torch.equal(torch.rand(3), expected_torch)
    assert loaded.trainer_state["data"] == {"position": 123, "epoch": 1}
    assert loaded.trainer_state["coordinator"]["outer_step"] == 3


def test_tied_weights_stored_once_with_alias_and_meta_is_complete(tmp_path):
    path = save(tmp_path, 3)
    with safe_open(path / "model.safetensors", "pt") as f:
        keys, st_meta = set(f.keys()), f.metadata()
    assert "tok_emb.weight" in keys and "lm_head.weight" not in keys
    assert st_meta["format"] == "speedtronic-ckpt-1"
    assert json.loads(st_meta["aliases"]) == {"lm_head.weight": "tok_emb.weight"}

    m = json.loads((path / "meta.json").read_text())
    assert m["format_version"] == 1 and m["step"] == 3 and m["run_id"] == "run-a"
    assert (m["tokens"], m["samples"], m["loss"], m["param_count"]) == (1024, 8, 2.5, 288)
    assert m["created_at"].endswith("Z") and m["config"] == CONFIG
    assert set(m["versions"]) == {"torch", "speedtronic", "python"}
    for name in ("model.safetensors", "trainer_state.pt"):
        data = (path / name).read_bytes()
        assert m["files"][name] == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_non_contiguous_tensors_are_stored_contiguous(tmp_path):
    transposed = torch.arange(6.0).reshape(2, 3).t()  # non-contiguous view
    path = save_checkpoint(tmp_path, 1, {"w": transposed}, {}, meta())
    assert torch.equal(load_checkpoint(path).model_state["w"], transposed)


def test_non_plain_trainer_state_is_refused_before_writing(tmp_path):
    class Opaque:
        pass

    with pytest.raises(CheckpointError, match=r"trainer_state\['plugin'\]\['obj'\]"):
        save_checkpoint(tmp_path, 1, {}, {"plugin": {"obj": Opaque()}}, meta())
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_latest_json_follows_each_save(tmp_path):
    save(tmp_path, 1)
    assert latest_json(tmp_path) == {"step": 1, "path": "step_0000000001"}
    save(tmp_path, 2)
    assert latest_json(tmp_path) == {"step": 2, "path": "step_0000000002"}
    assert find_latest(tmp_path) == tmp_path / "step_0000000002"
    assert names(tmp_path) == ["step_0000000001", "step_0000000002"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_saving_a_step_again_replaces_it(tmp_path):
    save(tmp_path, 1)
    (tmp_path / "step_0000000001" / "stale-file").write_text("from an earlier run")
    save(tmp_path, 1, run_id="run-b")
    assert load_checkpoint(tmp_path / "step_0000000001").meta["run_id"] == "run-b"
    assert not (tmp_path / "step_0000000001" / "stale-file").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "step_0000000001"]


# --------------------------------------------------------------------------- retention


def test_retention_keeps_newest_of_this_run_only(tmp_path):
    save(tmp_path, 2, run_id="other-run")
    for step in (1, 3, 4, 5):
        save(tmp_path, step, keep_last=2)
    assert names(tmp_path) == ["step_0000000002", "step_0000000004", "step_0000000005"]
    assert load_checkpoint(tmp_path / "step_0000000002").meta["run_id"] == "other-run"


def test_retention_never_deletes_the_checkpoint_just_written(tmp_path):
    save(tmp_path, 10)
    save(tmp_path, 5, keep_last=1)  # e.g. a restart from an older branch of the same run
    assert names(tmp_path) == ["step_0000000005", "step_0000000010"]
    assert latest_json(tmp_path)["step"] == 5
    save(tmp_path, 11, keep_last=1)
    assert names(tmp_path) == ["step_0000000011"]


def test_stale_tmp_dirs_of_dead_processes_are_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".tmp-step_0000000007-{dead.pid}"
    live = tmp_path / f".tmp-step_0000000008-{os.getppid()}"
    for d in (stale, live):
        d.mkdir(parents=True)
    save(tmp_path, 1)
    assert not stale.exists()
    assert live.exists()


# --------------------------------------------------------------------------- damage


def corrupt_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 10)


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda p: truncate(p / "model.safetensors"), "damaged (model.safetensors:"),
        (lambda p: corrupt_middle(p / "model.safetensors"), "model.safetensors: sha256 mismatch"),
        (lambda p: corrupt_middle(p / "trainer_state.pt"), "trainer_state.pt: sha256 mismatch"),
        (lambda p: (p / "meta.json").unlink(), "incomplete (meta.json missing)"),
        (lambda p: (p / "trainer_state.pt").unlink(), "incomplete (trainer_state.pt missing)"),
        (lambda p: shutil.rmtree(p), "incomplete (directory missing)"),
    ],
)
def test_find_latest_falls_back_from_damaged_newest(tmp_path, damage, expected):
    save(tmp_path, 1)
    damage(save(tmp_path, 2))
    messages: list[str] = []
    assert find_latest(tmp_path, log=messages.append) == tmp_path / "step_0000000001"
    assert len(messages) == 1
    assert messages[0].startswith("checkpoint step_0000000002 is ")
    assert expected in messages[0] and messages[0].endswith("; using step_0000000001")


def test_find_latest_scans_when_latest_json_is_corrupt_or_missing(tmp_path):
    assert find_latest(tmp_path) is None
    save(tmp_path, 1)
    save(tmp_path, 2)
    (tmp_path / "latest.json").write_text("{not json")
    messages: list[str] = []
    assert find_latest(tmp_path, log=messages.append) == tmp_path / "step_0000000002"
    assert "latest.json" in messages[0] and "unreadable" in messages[0]
    (tmp_path / "latest.json").unlink()
    assert find_latest(tmp_path, log=messages.append) == tmp_path / "step_0000000002"


def test_find_latest_returns_none_and_warns_when_nothing_is_usable(tmp_path):
    (save(tmp_path, 1) / "meta.json").unlink()
    with pytest.warns(UserWarning, match="no usable checkpoint left"):
        assert find_latest(tmp_path) is None


def test_load_refuses_damaged_files_naming_them(tmp_path):
    path = save(tmp_path, 1)
    corrupt_middle(path / "trainer_state.pt")
    with pytest.raises(CheckpointError, match="trainer_state.pt: sha256 mismatch"):
        load_checkpoint(path)
    assert verify_checkpoint(path) == ("damaged", "trainer_state.pt: sha256 mismatch")
    truncate(path / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(path)


class Exploit:
    """Unpickling this would run code (create a dir); weights_only loading must refuse it."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


def test_load_never_unpickles_arbitrary_objects(tmp_path):
    path = save(tmp_path, 1)
    marker = tmp_path / "pickle-ran"
    torch.save({"optimizer": Exploit(marker)}, path / "trainer_state.pt")
    data = (path / "trainer_state.pt").read_bytes()  # make meta agree, so only pickle is wrong
    meta_path = path / "meta.json"
    m = json.loads(meta_path.read_text())
    m["files"]["trainer_state.pt"] = {
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    meta_path.write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="trainer_state.pt: refused to load"):
        load_checkpoint(path)
    assert not marker.exists()


# --------------------------------------------------------------------------- failed writes


@pytest.mark.parametrize("failing_call", [1, 2, 3, 4, 5, 6])
def test_failed_write_leaves_previous_checkpoint_and_latest(tmp_path, monkeypatch, failing_call):
    """fsync calls: 1-3 data files and meta.json (on threads, any order), 4 the tmp dir,
    5 the root after the rename, 6 the latest.json tmp file."""
    root = tmp_path / "runs" / "x" / "checkpoints"
    save(root, 1)
    before = (root / "latest.json").read_bytes()
    counter, real_fsync = itertools.count(1), os.fsync

    def fsync(fd):
        if next(counter) == failing_call:  # next() is atomic: fsyncs run on several threads
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(CheckpointError) as info:
        save(root, 2)
    monkeypatch.undo()
    assert str(info.value) == f"could not write checkpoint to {root}: No space left on device"
    assert (root / "latest.json").read_bytes() == before
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == []
    assert [p.name for p in root.iterdir() if p.name.startswith("latest.json.")] == []
    if failing_call < 5:
        assert names(root) == ["step_0000000001"]
    assert find_latest(root) == root / "step_0000000001"
    load_checkpoint(root / "step_0000000001")


def test_failed_file_write_raises_checkpoint_error(tmp_path, monkeypatch):
    save(tmp_path, 1)

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt_save, "_write_safetensors", no_space)
    with pytest.raises(CheckpointError, match="No space left on device"):
        save(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "step_0000000001"]


# --------------------------------------------------------------------------- inspect / prune


def test_leftover_tmp_dir_is_ignored_by_find_latest_and_shown_incomplete(tmp_path):
    save(tmp_path, 1)
    leftover = tmp_path / ".tmp-step_0000000002-999999999"
    shutil.copytree(save(tmp_path / "elsewhere", 2), leftover)
    assert find_latest(tmp_path) == tmp_path / "step_0000000001"
    (tmp_path / "latest.json").unlink()
    assert find_latest(tmp_path) == tmp_path / "step_0000000001"
    report = inspect_path(tmp_path)
    rows = {c["name"]: c for c in report["checkpoints"]}
    assert rows[leftover.name]["status"] == "incomplete"
    assert "temporary" in rows[leftover.name]["problem"]
    assert rows["step_0000000001"]["status"] == "unverified"  # sound structure, not hashed


def test_inspect_path_reports_meta_tensors_and_config(tmp_path):
    out = tmp_path / "run"
    save(out / "checkpoints", 1)
    path = save(out / "checkpoints", 2)
    report = inspect_path(out)
    assert report["root"] == str(out / "checkpoints")
    assert report["latest"] == "step_0000000002"
    first, second = report["checkpoints"]
    assert (first["name"], first["is_latest"], second["is_latest"]) == (
        "step_0000000001",
        False,
        True,
    )
    assert second["path"] == str(path) and second["step"] == 2
    assert (second["tokens"], second["samples"], second["loss"]) == (1024, 8, 2.5)
    assert second["status"] == "unverified" and second["problem"] is None
    assert second["created_at"] == json.loads((path / "meta.json").read_text())["created_at"]
    assert second["size_bytes"] == sum(f.stat().st_size for f in path.iterdir())
    assert second["param_count"] == 288
    assert second["dtypes"] == {"float32": 7, "int64": 1}
    assert second["params_by_module"] == {
        "tok_emb": {"params": 128, "size_bytes": 512},
        "blocks": {"params": 144, "size_bytes": 576},
        "norm": {"params": 16, "size_bytes": 64},
        "positions": {"params": 4, "size_bytes": 32},
    }
    assert second["tied"] == {"lm_head.weight": "tok_emb.weight"}
    assert second["config_facts"] == {
        "model": "reference_transformer",
        "run_name": "smoke",
        "max_steps": 60,
        "precision": "auto",
        "micro_batch_size": 16,
        "target_batch_size": 32,
        "lr": 0.003,
    }
    json.dumps(report)  # serialisable as is


def test_inspect_flags_truncation_and_size_mismatch_without_hashing(tmp_path):
    one, two = save(tmp_path, 1), save(tmp_path, 2)
    truncate(one / "model.safetensors")
    with open(two / "trainer_state.pt", "ab") as f:
        f.write(b"junk")
    rows = inspect_path(tmp_path)["checkpoints"]
    assert rows[0]["status"] == "damaged" and "model.safetensors" in rows[0]["problem"]
    assert rows[1]["status"] == "damaged" and "trainer_state.pt" in rows[1]["problem"]


def test_inspect_checks_the_safetensors_header_against_the_file(tmp_path):
    one, two = save(tmp_path, 1), save(tmp_path, 2)
    with open(one / "model.safetensors", "r+b") as f:
        f.write((2**40).to_bytes(8, "little"))  # header length beyond the file
    with open(two / "model.safetensors", "ab") as f:
        f.write(b"\0" * 16)  # bytes no tensor accounts for, with meta.json made to agree
    m = json.loads((two / "meta.json").read_text())
    m["files"]["model.safetensors"]["bytes"] += 16
    (two / "meta.json").write_text(json.dumps(m))
    rows = inspect_path(tmp_path)["checkpoints"]
    assert rows[0]["status"] == "damaged" and "header length" in rows[0]["problem"]
    assert rows[1]["status"] == "damaged" and "header describes" in rows[1]["problem"]


def test_resolve_accepts_run_dir_root_or_one_checkpoint(tmp_path):
    path = save(tmp_path / "run" / "checkpoints", 1)
    root = tmp_path / "run" / "checkpoints"
    assert resolve_checkpoints(tmp_path / "run") == (root, [path])
    assert resolve_checkpoints(root) == (root, [path])
    assert resolve_checkpoints(path) == (root, [path])
    with pytest.raises(ConfigError, match="no checkpoints found"):
        resolve_checkpoints(tmp_path)  # holds only the run dir
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_checkpoints(tmp_path / "missing")


def test_inspect_does_not_import_torch(tmp_path):
    save(tmp_path / "checkpoints", 1)
    code = (
        "import json, sys\n"
        "from speedtronic.checkpoint.inspection import inspect_path\n"
        "report = inspect_path(sys.argv[1])\n"
        "assert report['checkpoints'][0]['status'] == 'unverified', report\n"
        "heavy = sorted(m for m in ('torch', 'safetensors', 'numpy') if m in sys.modules)\n"
        "print(json.dumps(heavy))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = proc_support.run([sys.executable, "-c", code, str(tmp_path)], env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_plan_prune_never_includes_latest_even_when_oldest(tmp_path):
    for step in (1, 2, 3):
        save(tmp_path, step)
    (tmp_path / "latest.json").write_text(json.dumps({"step": 1, "path": "step_0000000001"}))
    plan = plan_prune(tmp_path, keep=1)
    assert [item["name"] for item in plan] == ["step_0000000002"]
    assert plan[0]["step"] == 2 and plan[0]["path"] == str(tmp_path / "step_0000000002")
    assert plan[0]["size_bytes"] > 0
    apply_prune(plan)
    assert names(tmp_path) == ["step_0000000001", "step_0000000003"]


def test_plan_prune_counts_all_runs_and_apply_removes_dirs(tmp_path):
    save(tmp_path, 1, run_id="other-run")
    for step in (2, 3, 4):
        save(tmp_path, step)
    plan = plan_prune(tmp_path, keep=2)
    assert [item["name"] for item in plan] == ["step_0000000002", "step_0000000001"]
    apply_prune(plan)
    assert names(tmp_path) == ["step_0000000003", "step_0000000004"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert plan_prune(tmp_path, keep=5) == []
    for bad in (0, -1, True, "2"):
        with pytest.raises(ConfigError):
            plan_prune(tmp_path, keep=bad)


def test_apply_prune_reports_os_errors_naming_the_dir(tmp_path, monkeypatch):
    for step in (1, 2):
        save(tmp_path, step)
    plan = plan_prune(tmp_path, keep=1)

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "rename", denied)
    with pytest.raises(CheckpointError, match=r"step_0000000001: Permission denied"):
        apply_prune(plan)

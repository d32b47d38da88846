"""Damaged checkpoints of every shape are reported by name and skipped, never a crash.

Covers metadata that is valid JSON of the wrong shape (meta.json, latest.json, the
safetensors header), hostile nesting, retention and prune leaving damaged checkpoints alone,
``load_latest`` refusing to mistake a directory of unusable checkpoints for an empty one,
``ckpt inspect`` saying "unverified" unless it hashed, and ``ckpt inspect`` / ``ckpt prune``
refusing paths that name no checkpoints root (exit 2).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import proc_support
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from speedtronic.checkpoint import (
    NoUsableCheckpointError,
    find_latest,
    list_checkpoints,
    load_checkpoint,
    load_latest,
    save_checkpoint,
)
from speedtronic.checkpoint.inspection import inspect_path, left_alone, plan_prune
from speedtronic.checkpoint.plugin import trainer_state_problem
from speedtronic.cli.app import app
from speedtronic.errors import CheckpointError

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
# Deeper than any recursion limit: json.loads raises RecursionError on it.
DEEP = "[" * 100_000 + "]" * 100_000


def save(root: Path, step: int, run_id: str = "run-a", keep_last: int | None = None) -> Path:
    torch.manual_seed(step)
    model = nn.Linear(4, 4)
    meta = {"run_id": run_id, "tokens": 10 * step, "samples": step, "loss": 1.5, "config": {}}
    return save_checkpoint(root, step, model.state_dict(), {"data": step}, meta, keep_last)


def names(root: Path) -> list[str]:
    return [p.name for p in list_checkpoints(root)]


def read_meta(path: Path) -> dict:
    return json.loads((path / "meta.json").read_text())


def rewrite(path: Path, name: str, data: bytes) -> None:
    """Replace one data file and make meta.json agree, so that only its content is wrong."""
    (path / name).write_bytes(data)
    meta = read_meta(path)
    meta["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (path / "meta.json").write_text(json.dumps(meta))


def with_header_metadata(path: Path, metadata: object) -> bytes:
    """model.safetensors of ``path`` with its ``__metadata__`` replaced (tensor bytes kept)."""
    data = (path / "model.safetensors").read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    header["__metadata__"] = metadata
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    return len(blob).to_bytes(8, "little") + blob + data[8 + length :]


def truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 10)


def corrupt_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def files_record(change: dict):
    def apply(meta: dict) -> dict:
        record = {**meta["files"]["model.safetensors"], **change}
        return {**meta, "files": {**meta["files"], "model.safetensors": record}}

    return apply


# --------------------------------------------------------------------------- meta.json shape

BAD_META = {
    "nested too deeply": (lambda m: DEEP, "nested too deeply"),
    "step is a string": (lambda m: {**m, "step": "x"}, "'step' must be an integer >= 0"),
    "step missing": (lambda m: {k: v for k, v in m.items() if k != "step"}, "'step' missing"),
    "files is a list": (lambda m: {**m, "files": []}, "no file list"),
    "bytes is a string": (files_record({"bytes": "12"}), "bytes must be an integer"),
    "bytes is a bool": (files_record({"bytes": True}), "bytes must be an integer"),
    "sha256 is a number": (files_record({"sha256": 5}), "sha256 must be 64"),
    "record missing": (
        lambda m: {**m, "files": {"trainer_state.pt": m["files"]["trainer_state.pt"]}},
        "files['model.safetensors'] missing",
    ),
    "record is a list": (
        lambda m: {**m, "files": {**m["files"], "model.safetensors": [1]}},
        "must be an object",
    ),
    "run_id is a number": (lambda m: {**m, "run_id": 5}, "'run_id' must be a string"),
    "tokens is a bool": (lambda m: {**m, "tokens": True}, "'tokens' must be an integer"),
    "loss is a string": (lambda m: {**m, "loss": "nan"}, "'loss' must be a number"),
    "created_at is a number": (lambda m: {**m, "created_at": 1}, "'created_at' must be"),
    "config is a list": (lambda m: {**m, "config": [1]}, "'config' must be an object"),
    "not an object": (lambda m: [m], "no file list"),
}


@pytest.mark.parametrize("case", sorted(BAD_META))
def test_meta_of_the_wrong_shape_is_damaged_and_skipped_by_name(tmp_path, case):
    change, reason = BAD_META[case]
    save(tmp_path, 1)
    newest = save(tmp_path, 2)
    changed = change(read_meta(newest))
    text = changed if isinstance(changed, str) else json.dumps(changed)
    (newest / "meta.json").write_text(text)

    messages: list[str] = []
    assert find_latest(tmp_path, log=messages.append) == tmp_path / "step_0000000001"
    assert messages[0].startswith("checkpoint step_0000000002 is damaged (meta.json: ")
    assert reason in messages[0] and messages[0].endswith("; using step_0000000001")
    assert load_latest(tmp_path, log=messages.append).path == tmp_path / "step_0000000001"

    row = inspect_path(tmp_path)["checkpoints"][1]
    assert (row["name"], row["status"], row["step"]) == ("step_0000000002", "damaged", 2)
    assert reason in row["problem"]
    for args in ([], ["--format", "json"], ["--verify"]):  # the table formats every field
        result = runner.invoke(app, ["ckpt", "inspect", str(tmp_path), *args])
        assert result.exit_code == 0, result.stderr
        assert "damaged" in result.stdout


BAD_LATEST = {
    "nested too deeply": DEEP,
    "nested path": '{"step": 2, "path": ' + DEEP + "}",
    "step is a string": json.dumps({"step": "2", "path": "step_0000000002"}),
    "step disagrees with path": json.dumps({"step": 1, "path": "step_0000000002"}),
    "not an object": json.dumps(["step_0000000002"]),
}


@pytest.mark.parametrize("case", sorted(BAD_LATEST))
def test_latest_json_of_the_wrong_shape_is_reported_and_steps_are_scanned(tmp_path, case):
    save(tmp_path, 1)
    save(tmp_path, 2)
    (tmp_path / "latest.json").write_text(BAD_LATEST[case])
    messages: list[str] = []
    assert find_latest(tmp_path, log=messages.append) == tmp_path / "step_0000000002"
    assert "latest.json" in messages[0] and "scanning step_* directories" in messages[0]
    report = inspect_path(tmp_path)
    assert report["latest"] is None
    result = runner.invoke(app, ["ckpt", "inspect", str(tmp_path)])
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize(
    ("metadata", "reason"),
    [
        ({"format": "speedtronic-ckpt-1", "aliases": 5}, "__metadata__ is not a map of strings"),
        (["format"], "__metadata__ is not a map of strings"),
        ({"format": "speedtronic-ckpt-1", "aliases": DEEP}, "cannot be read"),
        ({"format": "speedtronic-ckpt-1", "aliases": '{"weight": []}'}, "aliases metadata"),
    ],
)
def test_safetensors_metadata_of_the_wrong_shape_is_damaged(tmp_path, metadata, reason):
    save(tmp_path, 1)
    newest = save(tmp_path, 2)
    rewrite(newest, "model.safetensors", with_header_metadata(newest, metadata))
    with pytest.raises(CheckpointError, match=f"step_0000000002 is damaged: .*{reason}"):
        load_checkpoint(newest)
    assert load_latest(tmp_path, log=lambda m: None).path.name == "step_0000000001"
    result = runner.invoke(app, ["ckpt", "inspect", str(tmp_path)])
    assert result.exit_code == 0, result.stderr


def test_trainer_state_shape_check_names_the_key_and_rule(tmp_path):
    good = {
        "step": 3,
        "tokens": 30,
        "samples": 3,
        "skipped_steps": 0,
        "last_loss": 1.5,
        "optimizer": {},
        "scheduler": None,
        "scaler": None,
        "data": None,
        "rng": {},
        "plugins": {},
    }

    def problem(state):
        return trainer_state_problem(SimpleNamespace(trainer_state=state))

    assert problem(good) is None
    assert problem({}) == "trainer_state.pt: 'step' missing"
    assert problem({**good, "step": "3"}) == (
        "trainer_state.pt: 'step' must be an integer >= 0 (got str)"
    )
    assert "'tokens' must be" in problem({**good, "tokens": True})
    assert "'rng' must be a dict" in problem({**good, "rng": None})
    assert "'last_loss' must be" in problem({**good, "last_loss": "1.5"})


# --------------------------------------------------------------------------- saving


def test_save_refuses_meta_that_readers_would_call_damaged(tmp_path):
    weights = nn.Linear(2, 2).state_dict()
    for bad, rule in (({"tokens": "12"}, "'tokens' must be"), ({"config": [1]}, "'config'")):
        with pytest.raises(CheckpointError, match=f"checkpoint meta: {rule}"):
            save_checkpoint(tmp_path, 1, weights, {}, {"run_id": "a", **bad})
    with pytest.raises(CheckpointError, match="run_id string"):
        save_checkpoint(tmp_path, 1, weights, {}, {"run_id": 7})
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
    # NumPy and tensor integers (as counters often are) are stored as plain JSON integers.
    meta = {
        "run_id": "a",
        "tokens": np.int64(12),
        "samples": torch.tensor(3),
        "loss": np.float32(2),
    }
    path = save_checkpoint(tmp_path, 1, weights, {}, meta)
    stored = read_meta(path)
    assert (stored["tokens"], stored["samples"], stored["loss"]) == (12, 3, 2.0)
    assert load_checkpoint(path).meta["tokens"] == 12


# --------------------------------------------------------------------------- retention


def test_retention_never_deletes_or_counts_damaged_checkpoints_of_this_run(tmp_path):
    for step in (1, 2, 3):
        save(tmp_path, step)
    truncate(tmp_path / "step_0000000001" / "model.safetensors")  # same run_id, damaged
    (tmp_path / "step_0000000003" / "trainer_state.pt").unlink()  # same run_id, incomplete
    save(tmp_path, 4, keep_last=2)
    # The two newest complete ones are kept; the damaged and incomplete ones are evidence.
    assert names(tmp_path) == [
        "step_0000000001",
        "step_0000000002",
        "step_0000000003",
        "step_0000000004",
    ]
    save(tmp_path, 5, keep_last=2)
    assert names(tmp_path) == [
        "step_0000000001",
        "step_0000000003",
        "step_0000000004",
        "step_0000000005",
    ]


# --------------------------------------------------------------------------- load_latest


def test_load_latest_raises_listing_each_checkpoint_when_none_is_usable(tmp_path):
    assert load_latest(tmp_path / "missing") is None  # no checkpoints at all: a first launch
    (tmp_path / ".tmp-step_0000000001-999999999").mkdir(parents=True)
    assert load_latest(tmp_path) is None  # a torn first write is not a checkpoint
    for step in (1, 2, 3):
        save(tmp_path, step)
    truncate(tmp_path / "step_0000000003" / "model.safetensors")
    corrupt_middle(tmp_path / "step_0000000002" / "trainer_state.pt")
    (tmp_path / "step_0000000001" / "meta.json").unlink()
    logged: list[str] = []
    with pytest.raises(NoUsableCheckpointError) as info:
        load_latest(tmp_path, log=logged.append)
    error = info.value
    assert isinstance(error, CheckpointError) and logged == []  # the error carries it all
    assert error.problems[0] == (
        f"no usable checkpoint in {tmp_path}: all 3 found are damaged or incomplete"
    )
    assert error.problems[1].strip().startswith("checkpoint step_0000000003 is damaged (model")
    assert "step_0000000002 is damaged (trainer_state.pt: sha256 mismatch)" in error.problems[2]
    assert "step_0000000001 is incomplete (meta.json missing)" in error.problems[3]
    assert all(line in str(error) for line in (p.strip() for p in error.problems[1:]))
    assert names(tmp_path) == ["step_0000000001", "step_0000000002", "step_0000000003"]


def test_load_latest_treats_a_validate_problem_as_damaged_and_falls_back(tmp_path):
    save(tmp_path, 1)
    save(tmp_path, 2)
    logged: list[str] = []

    def only_odd(checkpoint):
        return "even step" if checkpoint.meta["step"] % 2 == 0 else None

    found = load_latest(tmp_path, log=logged.append, validate=only_odd)
    assert found.path.name == "step_0000000001"
    assert logged == ["checkpoint step_0000000002 is damaged (even step); using step_0000000001"]


# --------------------------------------------------------------------------- inspect --verify


def test_inspect_says_unverified_unless_it_hashed(tmp_path):
    save(tmp_path, 1)
    corrupt_middle(save(tmp_path, 2) / "trainer_state.pt")  # same size: only a hash sees it
    rows = inspect_path(tmp_path)["checkpoints"]
    assert [r["status"] for r in rows] == ["unverified", "unverified"]
    report = inspect_path(tmp_path, verify=True)
    assert report["verified"] is True
    assert [r["status"] for r in report["checkpoints"]] == ["ok", "damaged"]
    assert report["checkpoints"][1]["problem"] == "trainer_state.pt: sha256 mismatch"

    table = runner.invoke(app, ["ckpt", "inspect", str(tmp_path)])
    assert table.exit_code == 0, table.stderr
    assert "unverified" in table.stdout
    assert "hashes not checked (use --verify)" in table.stdout
    verified = runner.invoke(app, ["ckpt", "inspect", str(tmp_path), "--verify"])
    assert verified.exit_code == 0, verified.stderr
    assert "sha256 mismatch" in verified.stdout and "hashes not checked" not in verified.stdout
    # The detailed tables fall back to the newest usable checkpoint, latest being damaged.
    assert "step_0000000001: parameters by module" in verified.stdout


def test_inspect_verify_does_not_import_torch(tmp_path):
    save(tmp_path / "checkpoints", 1)
    code = (
        "import json, sys\n"
        "from typer.testing import CliRunner\n"
        "from speedtronic.cli.app import app\n"
        "args = ['ckpt', 'inspect', sys.argv[1], '--verify', '--format', 'json']\n"
        "r = CliRunner().invoke(app, args)\n"
        "assert r.exit_code == 0, r.stderr\n"
        "assert json.loads(r.stdout)['checkpoints'][0]['status'] == 'ok', r.stdout\n"
        "print(json.dumps(sorted(m for m in ('torch', 'safetensors') if m in sys.modules)))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = proc_support.run([sys.executable, "-c", code, str(tmp_path)], env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


# --------------------------------------------------------------------------- prune / paths


@pytest.fixture
def root(tmp_path) -> Path:
    """Checkpoints 1-4 of one run in ``run/checkpoints``, latest.json at 4."""
    ckpts = tmp_path / "run" / "checkpoints"
    for step in (1, 2, 3, 4):
        save(ckpts, step)
    return ckpts


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("step_0000000002", "is one checkpoint, not a checkpoints directory"),
        ("latest.json", "is not a directory"),
        ("missing", "does not exist"),
        ("../..", "no checkpoints found in"),
        ("step_0000000002/model.safetensors", "is not a directory"),
    ],
)
def test_prune_refuses_anything_but_a_checkpoints_root_with_exit_2(root, target, message):
    before = snapshot(root)
    path = root / target
    for extra in (["--dry-run"], ["--yes"]):
        result = runner.invoke(app, ["ckpt", "prune", str(path), "--keep", "1", *extra])
        assert result.exit_code == 2, (result.stdout, result.stderr)
        assert result.stderr.startswith("speedtronic: error: ") and message in result.stderr
        assert "Traceback" not in result.stderr and "delete" not in result.stdout
    assert snapshot(root) == before


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("latest.json", "is not a directory"),
        ("missing", "does not exist"),
        ("../..", "no checkpoints found in"),
    ],
)
def test_inspect_refuses_paths_without_checkpoints_with_exit_2(root, target, message):
    result = runner.invoke(app, ["ckpt", "inspect", str(root / target)])
    assert result.exit_code == 2 and message in result.stderr
    assert "Traceback" not in result.stderr


def test_prune_dry_run_lists_exactly_what_is_then_deleted(root):
    plans = []
    for target in (root, root.parent):  # the checkpoints root, or the run dir holding it
        dry = runner.invoke(app, ["ckpt", "prune", str(target), "--keep", "2", "--dry-run"])
        assert dry.exit_code == 0, dry.stderr
        lines = dry.stdout.splitlines()
        plans.append({line.split()[2] for line in lines if line.startswith("would delete")})
    planned = plans[0]
    assert plans[1] == planned == {str(root / "step_0000000001"), str(root / "step_0000000002")}
    before = set(map(str, list_checkpoints(root)))
    result = runner.invoke(app, ["ckpt", "prune", str(root.parent), "--keep", "2", "--yes"])
    assert result.exit_code == 0, result.stderr
    assert before - set(map(str, list_checkpoints(root))) == planned


def test_prune_keeps_complete_checkpoints_and_leaves_damaged_ones(root):
    # The newest is damaged and an old one incomplete: --keep 1 must still leave a usable
    # checkpoint (the newest complete one), not count the damaged one as "kept".
    truncate(root / "step_0000000004" / "model.safetensors")
    (root / "step_0000000001" / "meta.json").unlink()
    save(root, 0, run_id="other-run")  # counted too: prune works on the whole root
    (root / "latest.json").write_text(json.dumps({"step": 4, "path": "step_0000000004"}))
    plan = plan_prune(root, keep=1)
    assert [item["name"] for item in plan] == ["step_0000000002", "step_0000000000"]
    assert [(i["name"], i["status"]) for i in left_alone(root)] == [
        ("step_0000000004", "damaged"),
        ("step_0000000001", "incomplete"),
    ]
    result = runner.invoke(app, ["ckpt", "prune", str(root), "--keep", "1", "--yes"])
    assert result.exit_code == 0, result.stderr
    assert f"leaving {root / 'step_0000000004'}: damaged (model.safetensors" in result.stdout
    assert names(root) == ["step_0000000001", "step_0000000003", "step_0000000004"]
    assert load_latest(root, log=lambda m: None).path.name == "step_0000000003"

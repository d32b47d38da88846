"""TensorBoard and W&B hooks against the real packages (the ``logging`` extra), no network.

TensorBoard: a real run's event files, read back with TensorBoard's own ``EventAccumulator``.
W&B: an offline run (``WANDB_MODE=offline``), its ``.wandb`` file decoded with wandb's own
``Record`` protobuf. Recent wandb (0.31 here) ships no Python reader for that file any more (
``wandb.sdk.internal.datastore`` left with the move to the Go core), so ``wandb_records`` reads
its framing: a 7-byte header, then 32 KiB blocks of ``crc32c, length, type`` chunks (the LevelDB
log format; the checksums are not checked). Each test skips, naming the extra, where its
package is absent; the missing-package test runs everywhere.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from speedtronic.runtime import train_from_config

EXTRA = "pip install 'speedtronic[logging]'"
TRAIN_TAGS = {"loss", "lr", "grad_norm", "tokens_per_s", "samples_per_s", "data_wait_share"}


def needs(package: str):
    reason = f"{package} is not installed; it comes with the logging extra: {EXTRA}"
    return pytest.importorskip(package, reason=reason)


class Recorder:
    """Keeps every event the run logged: what the hook was given, to compare with its files."""

    def __init__(self):
        self.events = []

    def __call__(self, event, payload):
        self.events.append((event, dict(payload)))

    def of(self, event):
        return [p for e, p in self.events if e == event]


def with_eval(tiny, tmp_path, steps):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i}: the quick brown fox.\n" for i in range(300)))
    tiny["run"]["max_steps"] = steps
    tiny["model"]["vocab_size"] = 256  # byte tokenizer
    tiny["data"].update(text_path=str(corpus), eval_fraction=0.1, eval_every=4, eval_batches=1)
    return tiny


def scalars_of(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


# ---------------------------------------------------------------- TensorBoard


def test_tensorboard_event_files_hold_every_tag_by_optimizer_step(tiny, tmp_path):
    needs("tensorboard")
    tiny = with_eval(tiny, tmp_path, steps=12)
    tiny["logging"]["hooks"] = ["tensorboard"]
    seen = Recorder()
    train_from_config(tiny, console=False, hooks=[seen])
    found = scalars_of(Path(tiny["run"]["output_dir"]) / "tensorboard")

    train, evals = seen.of("train_step"), seen.of("eval")
    optional = {k for k in ("mfu", "memory_gb") if train[0][k] is not None}  # None on a CPU
    expected = {f"train/{k}" for k in TRAIN_TAGS | optional} | {"eval/loss", "eval/ppl"}
    assert set(found) == expected
    for key in TRAIN_TAGS | optional:
        assert found[f"train/{key}"] == [(p["step"], pytest.approx(p[key])) for p in train]
    assert [s for s, _ in found["train/loss"]] == [1, 2, 4, 6, 8, 10, 12]
    assert found["eval/loss"] == [(p["step"], pytest.approx(p["eval_loss"])) for p in evals]
    assert [s for s, _ in found["eval/loss"]] == [4, 8, 12]


def test_tensorboard_dumb_diloco_outer_step_is_its_own_tag(tiny, tmp_path):
    needs("tensorboard")
    tiny["run"]["max_steps"] = 8
    tiny["logging"]["hooks"] = ["tensorboard"]
    # One master that trains: its worker waits at each boundary for the round holding its
    # delta (sync_wait_s), so the outer steps land at known optimizer steps.
    tiny["distributed"] = {
        "enabled": True,
        "role": "master",
        "node_id": "m",
        "path": str(tmp_path / "shared"),
        "inner_steps": 4,
        "min_deltas": 1,
        "poll_interval": 0.02,
        "min_publish_interval_s": 0,
        "sync_wait_s": 30,
        "drain_timeout_s": 0,  # a master alone: no wait at the end for a fleet to show up
    }
    train_from_config(tiny, console=False)
    found = scalars_of(Path(tiny["run"]["output_dir"]) / "tensorboard")

    assert found["diloco/outer_step"] == [(4, 1.0), (8, 2.0)]  # x: optimizer step
    assert [s for s, _ in found["diloco/stall_s"]] == [4, 8]
    assert found["diloco_round/included"] == [(1, 1.0), (2, 1.0)]  # x: outer step
    assert {"diloco_round/stale", "diloco_round/bad", "diloco_round/tokens"} <= set(found)
    assert [s for s, _ in found["train/loss"]] == [1, 2, 4, 6, 8]


# ---------------------------------------------------------------- W&B


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """W&B offline and silent, every file of it under tmp_path; returns WANDB_DIR."""
    needs("wandb")
    where = tmp_path / "wandb_dir"
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(where)}
    for name in ("CONFIG", "CACHE", "DATA", "ARTIFACT"):
        env[f"WANDB_{name}_DIR"] = str(tmp_path / f"wandb_{name.lower()}")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in ("WANDB_PROJECT", "WANDB_API_KEY", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(name, raising=False)
    where.mkdir()
    yield where
    import wandb

    wandb.teardown()  # wandb reads its environment once per setup: the next test gets its own


def wandb_records(path: Path) -> list:
    """Every record of a ``.wandb`` file, as wandb's own ``Record`` messages."""
    from wandb.proto import wandb_internal_pb2

    data, block, records, pending = path.read_bytes(), 32768, [], b""
    assert data[:4] == b":W&B", data[:7]
    pos = 7
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header: padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, or LAST of FIRST/MIDDLE.../LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def of_kind(records, kind):
    return [r for r in records if r.WhichOneof("record_type") == kind]


def history(records) -> list[dict]:
    rows = [
        {i.key or "/".join(i.nested_key): i.value_json for i in r.history.item}
        for r in of_kind(records, "history")
    ]
    return [{k: json.loads(v) for k, v in row.items()} for row in rows]


def run_files(where: Path) -> list[Path]:
    """The offline runs' files, complete: ``finish`` returns before wandb's service has written
    them out, ``teardown`` waits for it (as the end of a process does)."""
    import wandb

    wandb.teardown()
    return sorted(where.glob("wandb/offline-run-*/run-*.wandb"))


def test_wandb_offline_run_has_config_once_and_a_readable_history(tiny, tmp_path, offline):
    tiny = with_eval(tiny, tmp_path, steps=8)
    tiny["logging"]["hooks"] = ["wandb"]
    seen = Recorder()
    train_from_config(tiny, console=False, hooks=[seen])

    [path] = run_files(offline)
    assert (path.parent / "files").is_dir()
    records = wandb_records(path)
    [run] = of_kind(records, "run")
    assert not of_kind(records, "config")  # logged once, with the run, never updated
    config = {i.key: json.loads(i.value_json) for i in run.run.config.update}
    assert (run.run.project, run.run.display_name) == ("speedtronic", "tiny")
    assert {k: config[k] for k in ("name", "max_steps", "params")} == {
        k: seen.of("run_start")[0][k] for k in ("name", "max_steps", "params")
    }
    rows = history(records)
    train = [r for r in rows if "train/loss" in r]
    assert [(r["train/step"], r["train/loss"]) for r in train] == [
        (p["step"], pytest.approx(p["loss"])) for p in seen.of("train_step")
    ]
    evals = [r for r in rows if "eval/loss" in r]
    assert [(r["train/step"], r["eval/loss"]) for r in evals] == [
        (p["step"], pytest.approx(p["eval_loss"])) for p in seen.of("eval")
    ]
    axes = {m.metric.glob_name: m.metric.step_metric for m in of_kind(records, "metric")}
    assert axes["train/*"] == axes["eval/*"] == "train/step"
    assert of_kind(records, "exit")[0].exit.exit_code == 0


def test_wandb_a_crashed_run_is_closed_by_the_next_one(tiny, offline):
    """wandb.init returns a still-open run by default: the next run must not log into it."""
    tiny["logging"]["hooks"] = ["wandb"]

    class Crash:
        def after_optimizer_step(self, trainer):
            if trainer.step == 2:
                raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        train_from_config(tiny, console=False, plugins=[Crash()])
    tiny["run"]["max_steps"] = 2
    tiny["checkpoint"] = {"overwrite": True}  # the crash saved its 2 steps (issue 31)
    train_from_config(tiny, console=False)

    runs = {}  # by max_steps: the directory names order runs by the second only
    for path in run_files(offline):
        records = wandb_records(path)
        config = {i.key: i.value_json for i in of_kind(records, "run")[0].run.config.update}
        runs[json.loads(config["max_steps"])] = records
    crashed, second = runs[6], runs[2]
    assert of_kind(crashed, "exit")[0].exit.exit_code == 1
    assert of_kind(second, "exit")[0].exit.exit_code == 0
    assert [r["train/step"] for r in history(second)] == [1, 2]


def test_wandb_outer_steps_have_their_own_axis(tmp_path, offline):
    """The master's rounds (another thread, outer steps) next to the optimizer steps."""
    from speedtronic.observe.integrations import WandbHook

    hook = WandbHook()
    hook.on_event("run_start", {"name": "diloco", "output_dir": str(tmp_path)})
    hook.on_event("train_step", {"step": 4, "loss": 2.5})
    hook.on_event("diloco_round", {"outer_step": 1, "included": 2, "stale": 0, "bad": 0})
    hook.on_event("diloco_boundary", {"step": 4, "outer_step": 1, "stall_s": 0.01})
    hook.on_event("diloco_round", {"outer_step": 2, "included": 1, "stale": 1, "bad": 0})
    hook.on_event("run_end", {"status": "completed"})

    [path] = run_files(offline)
    records = wandb_records(path)
    rows = history(records)
    rounds = [(r["diloco_round/outer_step"], r["diloco_round/included"]) for r in rows[1::2]]
    assert rounds == [(1, 2), (2, 1)]  # both kept: each event is its own row
    assert (rows[2]["train/step"], rows[2]["diloco/outer_step"]) == (4, 1)
    axes = {m.metric.glob_name: m.metric.step_metric for m in of_kind(records, "metric")}
    assert axes["diloco_round/*"] == "diloco_round/outer_step"
    assert axes["diloco/*"] == "train/step"


# ---------------------------------------------------------------- without the extra


@pytest.mark.parametrize("package", ["tensorboard", "wandb"])
def test_a_missing_package_is_one_line_naming_the_extra(tiny, tmp_path, monkeypatch, package):
    from speedtronic.cli.app import app

    monkeypatch.setitem(sys.modules, package, None)  # as if not installed: imports fail
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    tiny["logging"]["hooks"] = [package]
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny))

    result = CliRunner().invoke(app, ["train", "-c", str(config)])
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stderr.splitlines() == [
        f"speedtronic: error: logging.hooks: {package} needs the {package} package: {EXTRA}"
    ]
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was built or written

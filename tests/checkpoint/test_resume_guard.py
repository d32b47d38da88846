"""Resume never silently starts over, and nothing deletes damaged checkpoints.

End to end through ``train_from_config`` and ``speedtronic train``: a resume that finds only
unusable checkpoints stops (exit 1) listing each and deletes nothing; a fresh run is refused
there and changes nothing, unless --overwrite says to replace them; a trainer state of the
wrong shape is a damaged checkpoint that resume falls back from; one that fits the shape but
not the run is a clear error, not a traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from speedtronic.checkpoint import load_checkpoint, save_checkpoint
from speedtronic.cli.app import app
from speedtronic.errors import CheckpointError, ConfigError
from speedtronic.runtime import train_from_config

runner = CliRunner()


def truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 10)


def corrupt_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def damage_all(ckpts: Path) -> list[tuple[str, str]]:
    """Damage steps 2, 4 and 6 three different ways; returns (name, reason) for each."""
    truncate(ckpts / "step_0000000006" / "model.safetensors")
    corrupt_middle(ckpts / "step_0000000004" / "trainer_state.pt")
    (ckpts / "step_0000000002" / "meta.json").unlink()
    return [
        ("step_0000000006", "is damaged (model.safetensors: "),
        ("step_0000000004", "is damaged (trainer_state.pt: sha256 mismatch)"),
        ("step_0000000002", "is incomplete (meta.json missing)"),
    ]


@pytest.fixture
def damaged_run(tiny, tmp_path):
    """A run with checkpoints at 2, 4 and 6, all unusable: ``(config, ckpts, reasons)``."""
    tiny["checkpoint"] = {"interval": 2}
    train_from_config(tiny, console=False)
    ckpts = tmp_path / "run" / "checkpoints"
    return tiny, ckpts, damage_all(ckpts)


def test_resume_with_only_damaged_checkpoints_stops_and_deletes_nothing(damaged_run):
    config, ckpts, reasons = damaged_run
    before = snapshot(ckpts)
    resume = {"interval": 2, "keep_last": 1, "resume": True}
    with pytest.raises(CheckpointError) as info:
        train_from_config({**config, "checkpoint": resume}, console=False)
    message = str(info.value)
    assert f"no usable checkpoint in {ckpts}" in message
    for name, reason in reasons:
        assert f"checkpoint {name} {reason}" in message
    hint = info.value.hint
    assert "--overwrite" in hint and "checkpoint.overwrite: true" in hint
    assert f"move {ckpts}" in hint
    assert snapshot(ckpts) == before  # nothing trained, saved, replaced or retained away


def test_cli_resume_with_only_damaged_checkpoints_exits_1_listing_each(damaged_run, tmp_path):
    config, ckpts, reasons = damaged_run
    before = snapshot(ckpts)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**config, "checkpoint": {"interval": 2, "keep_last": 1}}))
    result = runner.invoke(app, ["train", "-c", str(path), "--resume"])
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"speedtronic: error: no usable checkpoint in {ckpts}")
    for (name, reason), line in zip(reasons, lines[1:4], strict=True):
        assert line.startswith("speedtronic: error: ") and f"{name} {reason}" in line
    assert lines[4].startswith("hint: nothing was deleted") and "--overwrite" in lines[4]
    assert "Traceback" not in result.stderr
    assert snapshot(ckpts) == before


def test_a_fresh_run_over_damaged_checkpoints_changes_nothing_unless_told(tiny, tmp_path):
    # Retention's own rule (this run's complete checkpoints only) is tested in
    # test_checkpoint_damage; here, a fresh run never gets to mix with the damaged run.
    tiny["run"]["max_steps"] = 3
    tiny["checkpoint"] = {"interval": 1}
    train_from_config(tiny, console=False)
    ckpts = tmp_path / "run" / "checkpoints"
    for step in (1, 2, 3):
        truncate(ckpts / f"step_000000000{step}" / "model.safetensors")
    before = snapshot(ckpts)
    tiny["run"]["max_steps"] = 4
    tiny["checkpoint"] = {"interval": 2, "keep_last": 1}
    with pytest.raises(ConfigError, match="already holds a run .3 checkpoints, steps 1 to 3"):
        train_from_config(tiny, console=False)
    assert snapshot(ckpts) == before
    # --overwrite is the explicit choice: the damaged run goes, the new one is alone
    tiny["checkpoint"]["overwrite"] = True
    train_from_config(tiny, console=False)
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_0000000004"]


def rewrite_newest(ckpts: Path, change) -> None:
    """Save step 4 again with ``change(trainer_state)``, as a well-formed checkpoint."""
    newest = load_checkpoint(ckpts / "step_0000000004")
    keys = ("run_id", "tokens", "samples", "loss", "param_count", "config")
    meta = {key: newest.meta[key] for key in keys}
    save_checkpoint(ckpts, 4, newest.model_state, change(newest.trainer_state), meta)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda state: {}, "trainer_state.pt: 'step' missing"),
        (lambda state: {**state, "step": "4"}, "'step' must be an integer >= 0 (got str)"),
        (lambda state: {**state, "rng": None}, "'rng' must be a dict (got NoneType)"),
    ],
)
def test_trainer_state_of_the_wrong_shape_is_damaged_and_resume_falls_back(
    tiny, tmp_path, change, reason
):
    tiny["checkpoint"] = {"interval": 2}
    tiny["run"]["max_steps"] = 4
    train_from_config(tiny, console=False)
    rewrite_newest(tmp_path / "run" / "checkpoints", change)
    warnings: list[str] = []
    tiny["run"]["max_steps"] = 6
    result = train_from_config(
        {**tiny, "checkpoint": {"interval": 2, "resume": True}},
        console=False,
        hooks=[lambda e, p: e == "warning" and warnings.append(p["message"])],
    )
    assert warnings[0].startswith("checkpoint step_0000000004 is damaged (")
    assert reason in warnings[0] and warnings[0].endswith("; using step_0000000002")
    assert result.steps == 6 and result.tokens == 6 * 8 * 16


def test_trainer_state_that_does_not_restore_is_a_clear_error(tiny, tmp_path):
    tiny["checkpoint"] = {"interval": 2}
    tiny["run"]["max_steps"] = 4
    train_from_config(tiny, console=False)
    ckpts = tmp_path / "run" / "checkpoints"
    rewrite_newest(ckpts, lambda state: {**state, "optimizer": {}})  # right shape, no content
    with pytest.raises(CheckpointError) as info:
        train_from_config({**tiny, "checkpoint": {"resume": True}}, console=False)
    assert str(info.value).startswith(f"checkpoint {ckpts / 'step_0000000004'}: ")
    assert "trainer_state.pt cannot be restored into this run (KeyError: " in str(info.value)
    assert info.value.hint

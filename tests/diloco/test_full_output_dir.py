"""A full output directory is one line naming it, exit 1 (issue 35). torch.save's zip writer
swallowed the OS's ENOSPC and then failed on its own position check, so a DiLoCo worker whose
output dir filled up ended in ``RuntimeError: [enforce fail at inline_container.cc:672] .
unexpected pos ...``, naming nothing. The disk fills here at the lowest layer the checkpoint
writer reaches: the file object's ``write`` raises ``OSError(ENOSPC)`` once a few bytes are in.
"""

from __future__ import annotations

import builtins
import errno
import json

import pytest
import torch
from typer.testing import CliRunner

from speedtronic.checkpoint import save as ckpt_save
from speedtronic.checkpoint import save_checkpoint
from speedtronic.checkpoint.layout import STATE_FILE
from speedtronic.cli.app import app
from speedtronic.errors import CheckpointError


class FullDisk:
    """A binary file whose device holds ``room`` more bytes, then answers ENOSPC."""

    def __init__(self, f, room: int):
        self._f, self._room = f, room

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        if len(view) > self._room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self._room -= len(view)
        return self._f.write(view)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


@pytest.fixture
def full_disk(monkeypatch):
    """The trainer state's file fills the disk after 64 bytes (the zip header fits)."""

    def opener(path, mode="r", *args, **kwargs):
        f = builtins.open(path, mode, *args, **kwargs)
        return FullDisk(f, 64) if "w" in mode and str(path).endswith(STATE_FILE) else f

    monkeypatch.setattr(ckpt_save, "open", opener, raising=False)


def test_a_full_disk_under_torch_save_names_the_checkpoint_dir(tmp_path, full_disk):
    model = torch.nn.Linear(8, 8)
    state = {"optimizer": torch.optim.AdamW(model.parameters()).state_dict(), "x": torch.ones(99)}
    meta = {"run_id": "r", "config": {}}
    with pytest.raises(CheckpointError) as info:
        save_checkpoint(tmp_path / "checkpoints", 1, model.state_dict(), state, meta)
    assert str(info.value) == (
        f"could not write checkpoint to {tmp_path / 'checkpoints'}: No space left on device"
    )
    assert list((tmp_path / "checkpoints").iterdir()) == []  # no temporary dir left


def test_a_diloco_workers_full_output_dir_is_one_line_naming_it(tmp_path, full_disk, tiny):
    tiny["distributed"] = {
        "enabled": True,
        "role": "worker",
        "node_id": "w1",
        "repo_id": str(tmp_path / "repo"),
        "inner_steps": 3,
        "poll_interval": 0.1,
        "max_wait_s": 0.5,
        "delta_dtype": "fp32",
        "drain_timeout_s": 0,  # no master here: no global will come
    }
    (tmp_path / "repo").mkdir()
    (tmp_path / "c.yaml").write_text(json.dumps(tiny))
    result = CliRunner().invoke(app, ["train", "-c", str(tmp_path / "c.yaml")])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("speedtronic: ")]
    assert errors == [
        f"speedtronic: error: run.output_dir: could not write checkpoint to "
        f"{tmp_path / 'run' / 'checkpoints'}: No space left on device"
    ], result.stderr
    assert "inline_container" not in result.output and "Traceback" not in result.output

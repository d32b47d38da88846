"""A file the run writes cannot be written: one line naming the key and the file (issue 21).

``logging.file: /dev/full`` ended with ``OSError: [Errno 28] No space left on device``, which
names no file. Every file a run writes (text log, JSONL, checkpoints, TensorBoard events) now
fails with the config key and the path; what was written before stays intact.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from speedtronic.checkpoint import save as checkpoint_save
from speedtronic.checkpoint.layout import list_tmp_dirs, read_latest, verify_checkpoint
from speedtronic.cli.app import app
from speedtronic.observe import integrations
from speedtronic.observe.metrics import MetricLogger

runner = CliRunner()
FULL = Path("/dev/full")  # every write fails with ENOSPC, as on a full disk
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def train(tiny, tmp_path, *args: str):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny))
    return runner.invoke(app, ["train", "-c", str(config), *args])


def one_error_line(result, code: int = 1) -> str:
    assert result.exit_code == code, (result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    return errors[0]


@pytest.mark.skipif(not FULL.exists(), reason="needs Linux's /dev/full")
@pytest.mark.parametrize("key", ["file", "json_file"])
def test_a_log_file_on_a_full_disk_is_named_with_its_key(tiny, tmp_path, key):
    tiny["logging"][key] = str(FULL)
    line = one_error_line(train(tiny, tmp_path))
    reason = os.strerror(errno.ENOSPC)
    assert line == f"speedtronic: error: logging.{key}: cannot write {FULL}: {reason}"


def test_a_failed_checkpoint_write_names_its_key_and_keeps_the_last_one(
    tiny, tmp_path, monkeypatch
):
    real, calls = checkpoint_save._write_dir, []

    def disk_full_on_second_save(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise ENOSPC
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint_save, "_write_dir", disk_full_on_second_save)
    tiny["checkpoint"] = {"interval": 2}
    line = one_error_line(train(tiny, tmp_path, "--max-steps", "4"))
    root = tmp_path / "run" / "checkpoints"
    assert line == (
        f"speedtronic: error: run.output_dir: could not write checkpoint to {root}: "
        f"{os.strerror(errno.ENOSPC)}"
    )
    # what was written before the disk filled up is whole, and still what resume would use
    assert read_latest(root) == "step_0000000002"
    assert verify_checkpoint(root / "step_0000000002") == ("ok", None)
    assert list_tmp_dirs(root) == []


class FullDiskWriter:
    """A SummaryWriter whose background thread hit a full disk: the next call raises."""

    def add_scalar(self, *args):
        raise ENOSPC

    def close(self):
        raise ENOSPC


def test_tensorboard_events_on_a_full_disk_name_the_key_and_directory(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(integrations, "require", lambda *args, **kwargs: None)
    monkeypatch.setattr(integrations, "_summary_writer", lambda log_dir: FullDiskWriter())
    tiny["logging"]["hooks"] = ["tensorboard"]
    result = train(tiny, tmp_path)
    assert result.exit_code == 0, result.stderr  # a hook never ends a run: reported, disabled
    where = tmp_path / "run" / "tensorboard"
    warning = next(line for line in result.stderr.splitlines() if "TensorBoardHook" in line)
    assert warning.endswith(
        f"logging.hooks: tensorboard: cannot write events in {where}: {os.strerror(errno.ENOSPC)}"
    )


def test_resume_never_rewrites_a_jsonl_that_is_not_a_regular_file(tmp_path):
    # Resume rewrites the JSONL through a rename; onto /dev/null that would replace the device
    # with a regular file. A FIFO stands in for the device (a reader keeps it open).
    fifo = tmp_path / "events"
    os.mkfifo(fifo)
    threading.Thread(target=fifo.read_bytes, daemon=True).start()
    logger = MetricLogger(console=False, json_file=fifo)
    dropping = threading.Thread(target=logger.drop_records_after, args=(0,), daemon=True)
    dropping.start()
    dropping.join(timeout=30)  # reading a FIFO nobody writes would block: a hang is a failure
    assert not dropping.is_alive() and stat.S_ISFIFO(fifo.stat().st_mode)
    logger.close()

"""Hardening of the file sources: files that shrink while training, and non-regular files.

A shrunk file must stop the run with one line naming it (exit 1), in the main process and in
loader workers, without the SIGBUS a memory-mapped read would take; the last interval
checkpoint stays the newest. A FIFO or a character device is refused at once (exit 2)
instead of blocking the first read forever or never ending.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap

import numpy as np
import proc_support
import pytest
import yaml
from typer.testing import CliRunner

from speedtronic.cli.app import app
from speedtronic.config import SpeedtronicConfig
from speedtronic.data import DataStream, build_dataloader
from speedtronic.data.sources import (
    ByteTextBlocks,
    TokenFileBlocks,
    TokenizedTextStream,
    tokenize_file,
)
from speedtronic.data.tokenizer import ByteTokenizer
from speedtronic.errors import DataError, TrainingError

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX files")

TEXT = "".join(f"line {i}: café {'x' * (i % 7)}\n  indented {i * i}\n" for i in range(400))


@pytest.fixture
def deadline():
    """Turn a blocking open (the bug) into a failure instead of a hung test run."""

    def on_alarm(signum, frame):
        raise TimeoutError("blocked: the source waited on a file that never ends")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "corpus.bin"
    (np.arange(20_000) % 256).astype(np.uint16).tofile(path)
    return path


# ---- shrinking files -------------------------------------------------------------------------


def test_shrunk_text_file_is_a_training_error_naming_it(text_file):
    blocks = ByteTextBlocks(text_file, seq_len=16)
    assert len(blocks[3]["input_ids"]) == 16
    os.truncate(text_file, 100)
    blocks[2]  # still inside the file: fine
    with pytest.raises(TrainingError, match=r"data.text_path: .*corpus.txt shrank to 100 bytes"):
        blocks[len(blocks) - 1]


def test_shrunk_token_file_is_an_error_not_a_sigbus(token_file):
    # In a child process: a memory-mapped read past the new end kills it with SIGBUS.
    code = textwrap.dedent(
        f"""
        import os
        from speedtronic.data.sources import TokenFileBlocks
        from speedtronic.errors import TrainingError
        blocks = TokenFileBlocks({str(token_file)!r}, 16, "uint16", 256)
        blocks[5]
        os.truncate({str(token_file)!r}, 0)
        try:
            blocks[5]
        except TrainingError as exc:
            print("ERROR", exc)
        """
    )
    done = proc_support.run([sys.executable, "-c", code])
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "ERROR data.token_path: " in done.stdout and "shrank to 0 bytes" in done.stdout


def test_token_file_ids_are_still_checked_against_the_vocab(token_file):
    with pytest.raises(DataError, match=r"token id 200 at position 200, but model.vocab_size"):
        TokenFileBlocks(token_file, 16, "uint16", vocab_size=200)
    blocks = TokenFileBlocks(token_file, 16, "uint16", vocab_size=256)
    assert blocks[1]["input_ids"].tolist() == list(range(16, 32))
    assert blocks[1]["labels"].tolist() == list(range(17, 33))


def test_shrunk_tokenized_stream_is_a_training_error(text_file):
    stream = TokenizedTextStream(text_file, 16, ByteTokenizer(), segment_bytes=300)
    blocks = iter(stream)
    next(blocks)
    os.truncate(text_file, 200)  # the first segment is already read; the next is not
    with pytest.raises(TrainingError, match=r"data.text_path: .*corpus.txt shrank to 200 bytes"):
        for _ in blocks:
            pass


def config_for(path, key: str = "text_path", **data) -> SpeedtronicConfig:
    return SpeedtronicConfig.from_dict(
        {
            "model": {"vocab_size": 256, "seq_len": 16},
            "data": {key: str(path), "micro_batch_size": 4, **data},
        }
    )


@pytest.mark.parametrize("key", ["text_path", "token_path"])
def test_worker_errors_surface_as_one_line_naming_the_file(text_file, token_file, key):
    path = text_file if key == "text_path" else token_file
    stream = DataStream(build_dataloader(config_for(path, key, num_workers=2)))
    next(stream)
    os.truncate(path, 0)
    with pytest.raises(TrainingError) as caught:
        for _ in range(50):  # past what the workers prefetched before the truncation
            next(stream)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    assert message.startswith(f"data.{key}: {path} shrank to 0 bytes while training")


def write(tmp_path, config: dict) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def shrinking_run(tmp_path, key: str, path, workers: int) -> dict:
    """A config whose logging hook truncates ``path`` at step 2 (after its checkpoint data)."""
    module = f"shrinker_{key}_{workers}"  # unique: an imported module is cached per process
    (tmp_path / f"{module}.py").write_text(
        "import os\n"
        "def hook(event, payload):\n"
        "    if event == 'train_step' and payload['step'] == 2:\n"
        f"        os.truncate({str(path)!r}, 0)\n"
    )
    return {
        "run": {"device": "cpu", "max_steps": 40, "output_dir": str(tmp_path / "run")},
        "model": {"vocab_size": 256, "seq_len": 16, "n_layer": 1, "n_head": 2, "d_model": 32},
        "data": {key: str(path), "micro_batch_size": 4, "num_workers": workers},
        "checkpoint": {"interval": 2},
        "logging": {"every_steps": 1, "hooks": [f"{module}:hook"]},
    }


@pytest.mark.parametrize(("key", "workers"), [("text_path", 0), ("token_path", 2)])
def test_cli_run_on_a_shrinking_file_exits_1_and_keeps_the_good_checkpoint(
    tmp_path, text_file, token_file, monkeypatch, key, workers
):
    monkeypatch.syspath_prepend(str(tmp_path))
    path = text_file if key == "text_path" else token_file
    result = CliRunner().invoke(
        app, ["train", "-c", write(tmp_path, shrinking_run(tmp_path, key, path, workers))]
    )
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("speedtronic: error: ")]
    assert errors == [lines[-1]] and "Traceback" not in result.stderr
    assert f"data.{key}: {path} shrank to 0 bytes while training" in errors[0]
    names = [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()]
    saved = sorted(int(name[5:]) for name in names if name.startswith("step_"))
    # Only interval checkpoints of steps trained on good data: no end-of-run save of the
    # failed run. Workers may have prefetched 2 x 2 good batches before the truncation.
    assert saved == [2] if workers == 0 else 2 <= saved[-1] <= 6, saved
    assert "loss 0.0000" not in result.stderr


# ---- non-regular files -----------------------------------------------------------------------


def test_fifo_is_refused_at_once_by_every_source(tmp_path, deadline):
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    makers = [
        lambda: ByteTextBlocks(fifo, 16),
        lambda: TokenFileBlocks(fifo, 16, "uint16", None),
        lambda: TokenizedTextStream(fifo, 16, ByteTokenizer()),
        lambda: tokenize_file(fifo, tmp_path / "out.bin", ByteTokenizer()),
    ]
    for make in makers:
        with pytest.raises(DataError, match=r"pipe.txt is a named pipe \(FIFO\), not a regular"):
            make()


def test_character_device_is_refused(deadline):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    with pytest.raises(DataError, match=r"data.token_path: /dev/zero is a character device"):
        TokenFileBlocks("/dev/zero", 16, "uint16", None)


def test_file_replaced_by_a_fifo_while_training_does_not_hang(text_file, deadline):
    blocks = ByteTextBlocks(text_file, 16)
    text_file.unlink()
    os.mkfifo(text_file)
    with pytest.raises(TrainingError, match=r"corpus.txt was replaced by a named pipe"):
        blocks[0]


@pytest.mark.parametrize("key", ["text_path", "token_path", "eval_path"])
def test_cli_refuses_a_fifo_with_exit_2_naming_the_key(tmp_path, text_file, key, deadline):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    data = {key: str(fifo)} if key != "eval_path" else {"text_path": str(text_file), key: str(fifo)}
    config = {
        "run": {"device": "cpu", "max_steps": 2, "output_dir": str(tmp_path / "run")},
        "model": {"vocab_size": 256, "seq_len": 16, "n_layer": 1, "n_head": 2, "d_model": 32},
        "data": {"micro_batch_size": 4, **data},
    }
    result = CliRunner().invoke(app, ["train", "-c", write(tmp_path, config)])
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"speedtronic: error: data.{key}: {fifo}")
    assert "named pipe (FIFO), not a regular file" in lines[0]

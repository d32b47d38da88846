"""Issue 31, items 1-3: what a run checks before it touches anything, and keeps when it fails.

1. ``--overwrite`` deleted the old run before it knew the new one could start; the refusal of
   a directory holding a run hid the config's typo behind a suggestion to use ``--overwrite``.
2. ``data.source: synthetic`` plus a ``data.text_path`` trained on synthetic tokens and exited
   0; nothing named the data a run reads.
3. Bad UTF-8 surfaced mid-run, naming a byte that was not the first bad one, and an error at
   any step saved nothing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from speedtronic.checkpoint.layout import list_step_dirs, read_latest
from speedtronic.cli.app import app
from speedtronic.config import SpeedtronicConfig
from speedtronic.errors import ConfigError, DataError
from speedtronic.runtime import train_from_config

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def train(tiny, tmp_path, *args: str):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny))
    return runner.invoke(app, ["train", "-c", str(config), *args])


def snapshot(root) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def bad_utf8_file(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"plain text. " * 10 + b"\xe9" + b"more text. " * 2000 + b"\xff" + b"end")
    return path


# Each a mistake that only building the model, the data or the initial weights finds.
MISTAKES = {
    "a model key typo": (["--set", "model.n_layers=2"], "model.n_layers: unknown parameter"),
    "n_head not dividing d_model": (["--set", "model.n_head=3"], "model.d_model: must be"),
    "a missing text file": (
        ["--set", "data.text_path=missing.txt", "--set", "model.vocab_size=256"],
        "data.text_path: file",
    ),
    "bad UTF-8": (None, "is not valid UTF-8 at byte 120"),
    "init weights of another shape": (None, "checkpoint.init_from: "),
}


def mistake_args(name, tiny, tmp_path):
    args, _ = MISTAKES[name]
    if name == "bad UTF-8":
        return [
            "--set",
            f"data.text_path={bad_utf8_file(tmp_path)}",
            "--set",
            "model.vocab_size=256",
        ]
    if name == "init weights of another shape":
        other = {**tiny, "run": {**tiny["run"], "output_dir": str(tmp_path / "other")}}
        other["model"] = {**tiny["model"], "d_model": 64}
        train_from_config(other, console=False)
        return ["--init-from", str(tmp_path / "other")]
    return args


@pytest.mark.parametrize("name", MISTAKES)
def test_overwrite_deletes_nothing_when_the_new_run_cannot_start(tiny, tmp_path, name):
    """Item 1: the new run is checked whole (config, model build, data files, init weights)
    before --overwrite deletes the old one."""
    tiny["logging"]["json_file"] = "metrics.jsonl"
    assert train(tiny, tmp_path, "--max-steps", "4").exit_code == 0
    before = snapshot(tmp_path / "run")
    result = train(tiny, tmp_path, "--overwrite", *mistake_args(name, tiny, tmp_path))
    assert result.exit_code == 2, result.output
    assert MISTAKES[name][1] in result.stderr.splitlines()[0], result.stderr
    assert snapshot(tmp_path / "run") == before
    assert read_latest(tmp_path / "run" / "checkpoints") == "step_0000000004"


@pytest.mark.parametrize("name", ["a model key typo", "a missing text file"])
def test_a_directory_holding_a_run_names_the_typo_before_suggesting_overwrite(tiny, tmp_path, name):
    """Item 1: the typo comes first; "already holds a run ... --overwrite" would invite a user
    to delete the old run for a config that cannot start anyway."""
    assert train(tiny, tmp_path, "--max-steps", "2").exit_code == 0
    result = train(tiny, tmp_path, *mistake_args(name, tiny, tmp_path))
    assert result.exit_code == 2
    assert MISTAKES[name][1] in result.stderr.splitlines()[0], result.stderr
    assert "already holds a run" not in result.stderr and "--overwrite" not in result.stderr


def test_a_data_path_the_source_does_not_read_is_refused_naming_both_keys():
    """Item 2: an explicit source and a path that contradict it are an error."""
    with pytest.raises(ConfigError) as caught:
        SpeedtronicConfig.from_dict({"data": {"source": "synthetic", "text_path": "corpus.txt"}})
    message = str(caught.value)
    assert "data.text_path: 'corpus.txt' is not read, because data.source is 'synthetic'" in message
    assert "set data.source: text (or auto" in message
    with pytest.raises(ConfigError, match=r"data\.token_path: 'a\.bin' is not read.*'text'"):
        SpeedtronicConfig.from_dict({"data": {"source": "text", "token_path": "a.bin"}})
    with pytest.raises(ConfigError, match=r"data\.tokenizer: 'tok\.json' is not read.*'synth"):
        SpeedtronicConfig.from_dict({"data": {"tokenizer": "tok.json"}})


def test_the_gpt2_config_follows_a_text_path(tmp_path):
    """Item 2: the shipped GPT-2 config no longer pins the source, so a path is read."""
    path = ROOT / "configs" / "gpt2_small.yaml"
    config = SpeedtronicConfig.from_file(path, ["data.text_path=c.txt"])
    assert config.data.resolved_source == "text"
    assert SpeedtronicConfig.from_file(path).data.resolved_source == "synthetic"


def test_the_start_line_names_the_data_source_and_its_size(tiny, tmp_path):
    """Item 2: run_start (the plain line, the live table's title, JSONL) names the data."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"some words of text\n" * 200)  # 3.7 KB
    tiny["data"]["text_path"] = str(corpus)
    tiny["model"]["vocab_size"] = 256
    starts = []
    train_from_config(
        tiny, console=False, hooks=[lambda e, p: e == "run_start" and starts.append(p)]
    )
    data = starts[0]["data"]
    assert data.startswith(f"text {corpus} (3.7 KB, byte tokens); ") and "training blocks" in data
    tiny["data"].pop("text_path")
    tiny["run"]["output_dir"] += "-synthetic"
    starts.clear()
    train_from_config(
        tiny, console=False, hooks=[lambda e, p: e == "run_start" and starts.append(p)]
    )
    assert starts[0]["data"].startswith("synthetic (")


def test_bad_utf8_stops_before_the_first_step_naming_the_first_bad_byte(tiny, tmp_path):
    """Item 3: the whole file is checked at start; the first bad byte (120) is named, not the
    one in whichever block the shuffled sampler read first."""
    tiny["data"]["text_path"] = str(bad_utf8_file(tmp_path))
    tiny["model"]["vocab_size"] = 256
    result = train(tiny, tmp_path)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not valid UTF-8 at byte 120;" in lines[0], result.stderr
    assert "step 1" not in result.output and not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize(
    ("data", "first"),
    [
        (b"ab\xc3\xa9cd" * 3 + b"\xff", 18),  # after characters cut by every chunk edge
        (b"abc\xc3", 3),  # the file ends inside a character
        (b"a\xc3" + b"b", 1),  # a lead byte whose continuation is missing, across an edge
        (b"\x80abc", 0),
    ],
)
def test_the_utf8_check_names_the_first_bad_offset_across_chunk_edges(tmp_path, data, first):
    from speedtronic.data.utf8 import check_utf8

    path = tmp_path / "t.txt"
    path.write_bytes(data)
    for chunk in (1, 2, 3, 64):
        with pytest.raises(DataError, match=rf"at byte {first};"):
            check_utf8(path, "data.text_path", chunk_bytes=chunk)
    path.write_bytes("é€𝄞 text".encode() * 5)
    for chunk in (1, 2, 3, 64):
        check_utf8(path, "data.text_path", chunk_bytes=chunk)


FAILING_MODEL = """
import os
from torch import nn
from speedtronic import register_model

@register_model("fails_once")
class FailsOnce(nn.Module):
    calls = 0

    def __init__(self, vocab_size=64, width=16):
        super().__init__()
        FailsOnce.calls = 0  # per run: the module stays imported from one test to the next
        self.embed, self.head = nn.Embedding(vocab_size, width), nn.Linear(width, vocab_size)

    def forward(self, input_ids, labels):
        FailsOnce.calls += 1
        if FailsOnce.calls == int(os.environ.get("FAIL_AT_CALL", "0")):
            raise ValueError("the model broke")
        logits = self.head(self.embed(input_ids))
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
"""


def test_an_error_after_the_first_step_saves_a_checkpoint_and_keeps_its_exit_code(
    tiny, tmp_path, monkeypatch
):
    """Item 3: as Ctrl-C does, an error at step N > 1 saves step N - 1 first, names it, and the
    run exits with the error's code; --resume then continues from it."""
    (tmp_path / "failing_models.py").write_text(FAILING_MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    tiny["model"] = {"name": "fails_once", "imports": ["failing_models"], "vocab_size": 256}
    tiny["data"]["seq_len"] = 16
    monkeypatch.setenv("FAIL_AT_CALL", "9")  # 2 micro-batches a step: the 5th step's first
    result = train(tiny, tmp_path)
    assert result.exit_code == 1, result.output
    root = tmp_path / "run" / "checkpoints"
    assert read_latest(root) == "step_0000000004"
    notice = next(line for line in result.stderr.splitlines() if "step 5 failed" in line)
    assert f"the checkpoint of step 4 is {root / 'step_0000000004'}" in notice
    assert "--resume" in notice and "ValueError: the model broke" in result.stderr
    meta = json.loads((root / "step_0000000004" / "meta.json").read_text())
    assert meta["samples"] == 4 * 8 and meta["tokens"] == 4 * 8 * 16  # the failed step undone
    monkeypatch.delenv("FAIL_AT_CALL")
    resumed = train(tiny, tmp_path, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert "resumed from" in resumed.stderr and read_latest(root) == "step_0000000006"


def test_the_checkpoint_after_an_error_holds_the_last_completed_steps_data_position(tiny):
    """Item 3: the failed step's batches are read again on resume (its counters undone)."""

    class BreaksAt(torch.utils.data.Dataset):
        def __init__(self, after: int):
            self.left = after

        def __len__(self):
            return 1000

        def __getitem__(self, index):
            self.left -= 1
            if self.left < 0:
                raise DataError("data: the source broke")
            ids = torch.arange(17) % 64
            return {"input_ids": ids[:-1], "labels": ids[1:]}

    tiny["data"]["shuffle"] = False
    with pytest.raises(DataError, match="the source broke"):
        train_from_config(tiny, console=False, dataset=BreaksAt(3 * 8 + 5))  # mid step 4
    [path] = list_step_dirs(tiny["run"]["output_dir"] + "/checkpoints")
    state = torch.load(path / "trainer_state.pt", weights_only=True)
    assert state["step"] == 3 and state["samples"] == 24
    assert state["data"] == {"epoch": 0, "batch": 6}  # 3 steps x 2 micro-batches


def test_an_error_at_the_first_step_saves_nothing(tiny, tmp_path, monkeypatch):
    (tmp_path / "failing_models.py").write_text(FAILING_MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    tiny["model"] = {"name": "fails_once", "imports": ["failing_models"], "vocab_size": 256}
    tiny["data"]["seq_len"] = 16
    monkeypatch.setenv("FAIL_AT_CALL", "1")
    result = train(tiny, tmp_path)
    assert result.exit_code == 1
    assert not list_step_dirs(tmp_path / "run" / "checkpoints") and "failed" not in result.stderr


def test_overwrite_keeps_the_run_for_a_typo_in_a_model_of_ones_own(tiny, tmp_path, monkeypatch):
    """Item 1: a model other than the reference one is built (on the meta device) before
    --overwrite deletes anything, since only building it finds its parameters' mistakes."""
    (tmp_path / "failing_models.py").write_text(FAILING_MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    tiny["model"] = {"name": "fails_once", "imports": ["failing_models"], "vocab_size": 256}
    tiny["data"]["seq_len"] = 16
    assert train(tiny, tmp_path, "--max-steps", "2").exit_code == 0
    before = snapshot(tmp_path / "run")
    result = train(tiny, tmp_path, "--overwrite", "--set", "model.widht=8")
    assert result.exit_code == 2
    assert "model.widht: unknown parameter for model 'fails_once'; did you mean 'width'?" in (
        result.stderr
    )
    assert snapshot(tmp_path / "run") == before

"""Text and token-file sources: exact blocks, UTF-8, worker sharding, resume, evaluation."""

from __future__ import annotations

import json
import os
import random
import stat

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from speedtronic.cli.app import app
from speedtronic.config import SpeedtronicConfig
from speedtronic.data import DataStream, build_dataloader
from speedtronic.data.sources import (
    ByteTextBlocks,
    TokenFileBlocks,
    TokenizedTextStream,
    segment_bounds,
    shuffled,
    tokenize_file,
)
from speedtronic.data.tokenizer import ByteTokenizer, HFTokenizer, check_vocab
from speedtronic.errors import DataError
from speedtronic.runtime import train_from_config

TEXT = "".join(
    f"line {i}: naïve café — 東京 {'x' * (i % 7)} ünïcødé ✓\n  indented {i * i}\n"
    for i in range(300)
)


@pytest.fixture
def tiny(tiny):
    """The shared tiny config with a byte-level vocabulary."""
    tiny["model"]["vocab_size"] = 256
    return tiny


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def test_byte_blocks_are_exact_windows(text_file):
    data = text_file.read_bytes()
    blocks = ByteTextBlocks(text_file, seq_len=16)
    assert len(blocks) == (len(data) - 1) // 16
    for k in (0, 1, 7, len(blocks) - 1):
        window = list(data[k * 16 : k * 16 + 17])
        assert blocks[k]["input_ids"].tolist() == window[:-1]
        assert blocks[k]["labels"].tolist() == window[1:]
    with pytest.raises(IndexError):
        blocks[len(blocks)]


def test_invalid_utf8_names_the_byte_offset(tmp_path):
    """Checked when the source is built (issue 31: the whole file, before the first step)."""
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"a" * 40 + "café".encode("latin-1") + b"b" * 40)
    with pytest.raises(DataError, match=r"not valid UTF-8 at byte 43"):
        ByteTextBlocks(path, seq_len=16)
    with pytest.raises(DataError, match=r"not valid UTF-8 at byte 43"):
        TokenizedTextStream(path, 16, ByteTokenizer())


def test_a_file_changed_to_bad_utf8_under_the_run_is_still_caught_as_it_is_read(tmp_path):
    path = tmp_path / "text.txt"
    path.write_bytes(b"a" * 100)
    blocks, stream = (
        ByteTextBlocks(path, seq_len=16),
        TokenizedTextStream(path, 16, ByteTokenizer()),
    )
    path.write_bytes(b"a" * 40 + "café".encode("latin-1") + b"b" * 56)  # same size
    with pytest.raises(DataError, match=r"not valid UTF-8 at byte 43"):
        for k in range(len(blocks)):
            blocks[k]
    with pytest.raises(DataError, match=r"not valid UTF-8 at byte 43"):
        list(stream)


def test_multibyte_characters_across_block_edges_are_fine(text_file):
    blocks = ByteTextBlocks(text_file, seq_len=5)  # odd size: edges land inside characters
    for k in range(len(blocks)):
        blocks[k]


def config_for(path, **data) -> SpeedtronicConfig:
    return SpeedtronicConfig.from_dict(
        {
            "model": {"vocab_size": 256, "seq_len": 16},
            "data": {"text_path": str(path), "micro_batch_size": 4, **data},
        }
    )


def test_workers_read_disjoint_blocks_and_cover_the_epoch(text_file):
    def epoch(workers):
        loader = build_dataloader(config_for(text_file, num_workers=workers))
        return sorted(tuple(row) for batch in loader for row in batch["input_ids"].tolist())

    serial, parallel = epoch(0), epoch(2)
    assert parallel == serial  # the same blocks, each once
    assert len(serial) == len(ByteTextBlocks(text_file, 16)) // 4 * 4  # all full batches


class RecordingBlocks(ByteTextBlocks):
    """Records which process read which block, to prove workers share the file, not read it."""

    log_dir = None

    def __getitem__(self, index):
        with open(os.path.join(self.log_dir, str(os.getpid())), "a") as f:
            f.write(f"{index}\n")
        return super().__getitem__(index)


def test_no_worker_reads_the_whole_file(text_file, tmp_path):
    logs = tmp_path / "reads"
    logs.mkdir()
    RecordingBlocks.log_dir = str(logs)
    dataset = RecordingBlocks(text_file, 16)
    loader = build_dataloader(config_for(text_file, num_workers=2), dataset=dataset)
    for _ in loader:
        pass
    reads = [set(map(int, p.read_text().split())) for p in logs.iterdir()]
    assert len(reads) == 2 and not reads[0] & reads[1]
    assert all(len(r) < len(dataset) * 0.75 for r in reads)


def write_bpe(tmp_path, text: str):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([text], trainer=trainer)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def test_segmented_tokenization_equals_whole_text(text_file, tmp_path):
    tokenizer = HFTokenizer(write_bpe(tmp_path, TEXT))
    bounds = segment_bounds(text_file, segment_bytes=300)
    assert len(bounds) > 20
    data = text_file.read_bytes()
    pieces = [tokenizer(data[a:b].decode()) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    assert sum(pieces, []) == tokenizer(TEXT)


def test_stream_blocks_do_not_depend_on_workers(text_file, tmp_path):
    tokenizer = HFTokenizer(write_bpe(tmp_path, TEXT))
    stream = TokenizedTextStream(text_file, 16, tokenizer, segment_bytes=300)
    expected = [tuple(b["input_ids"].tolist()) for b in stream]
    assert len(set(expected)) == len(expected)
    cfg = config_for(
        text_file, tokenizer=str(tmp_path / "tokenizer.json"), num_workers=2, shuffle=False
    )
    cfg.model.params["vocab_size"] = 400
    loader = build_dataloader(cfg, dataset=stream)
    got = [tuple(row) for batch in loader for row in batch["input_ids"].tolist()]
    assert len(got) == len(set(got)) and set(got) <= set(expected)  # no duplicates
    assert len(expected) - len(got) < 2 * 4  # only each worker's last partial batch is dropped


def test_shuffle_buffer_is_a_seeded_permutation():
    items = list(range(100))
    a = list(shuffled(iter(items), 10, random.Random(1)))
    assert sorted(a) == items and a != items
    assert a == list(shuffled(iter(items), 10, random.Random(1)))


def test_token_files_round_trip_and_validate(text_file, tmp_path):
    progress = []
    out = tmp_path / "corpus.bin"
    count = tokenize_file(
        text_file,
        out,
        ByteTokenizer(),
        "uint16",
        lambda done, total: progress.append((done, total)),
    )
    data = text_file.read_bytes()
    assert count == len(data) and progress[-1] == (len(data), len(data))
    assert np.fromfile(out, dtype=np.uint16).tolist() == list(data)
    blocks = TokenFileBlocks(out, 16, "uint16", vocab_size=256)
    assert blocks[3]["input_ids"].tolist() == list(data[48:64])
    with pytest.raises(
        DataError, match=r"has token id \d+ at position \d+, but model.vocab_size is 100"
    ):
        TokenFileBlocks(out, 16, "uint16", vocab_size=100)
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02")
    with pytest.raises(DataError, match="not a multiple of 2"):
        TokenFileBlocks(odd, 16, "uint16", vocab_size=256)


def test_tokenizer_vocab_mismatch_is_a_clear_error():
    with pytest.raises(DataError, match=r"model.vocab_size: 128 is smaller than the tokenizer's"):
        check_vocab(ByteTokenizer(), 128)
    check_vocab(ByteTokenizer(), 320)  # padding the vocabulary is fine


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: None, "file not found"),
        (lambda p: p.write_bytes(b""), "is empty"),
        (lambda p: p.write_bytes(b"short"), "fewer than one block"),
    ],
)
def test_bad_text_files_exit_2_with_one_line(tiny, tmp_path, make, needle):
    path = tmp_path / "data.txt"
    make(path)
    tiny["data"]["text_path"] = str(path)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny))
    result = CliRunner().invoke(app, ["train", "-c", str(config)])
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "data.text_path" in lines[0]


def test_invalid_utf8_mid_run_is_one_line_exit_2_even_from_a_worker(tiny, tmp_path):
    path = tmp_path / "data.txt"
    path.write_bytes(b"abc " * 50 + b"\xff" + b" xyz" * 50)
    tiny["data"].update(text_path=str(path), num_workers=1, shuffle=False)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny))
    result = CliRunner().invoke(app, ["train", "-c", str(config)])
    assert result.exit_code == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("speedtronic:")]
    assert errors == [errors[0]] and "not valid UTF-8 at byte 200" in errors[0], result.stderr
    assert errors[0].startswith("speedtronic: error: data.text_path: ")


def test_exact_resume_for_text_and_token_files(tiny, tmp_path, text_file):
    from checkpoint.test_resume import straight_and_split

    tiny["data"]["text_path"] = str(text_file)
    straight_and_split(tiny, tmp_path / "text")
    out = tmp_path / "corpus.bin"
    tokenize_file(text_file, out, ByteTokenizer())
    tiny["data"] = {**tiny["data"], "text_path": None, "token_path": str(out)}
    tiny["run"]["output_dir"] = str(tmp_path / "tok")
    straight_and_split(tiny, tmp_path / "tok2")


def test_evaluation_cadence_and_training_untouched(tiny, tmp_path, text_file):
    tiny["data"].update(text_path=str(text_file), eval_fraction=0.1)
    tiny["run"]["max_steps"] = 7
    events = []
    plain = train_from_config(tiny, console=False)
    tiny["data"]["eval_every"] = 3
    tiny["run"]["output_dir"] = str(tmp_path / "with_eval")
    evaluated = train_from_config(tiny, console=False, hooks=[lambda e, p: events.append((e, p))])
    evals = [p for e, p in events if e == "eval"]
    assert [p["step"] for p in evals] == [3, 6, 7]
    assert all(
        p["eval_loss"] > 0 and p["eval_ppl"] == pytest.approx(np.exp(p["eval_loss"])) for p in evals
    )
    assert evaluated.final_loss == plain.final_loss
    from speedtronic.checkpoint import load_checkpoint

    a = load_checkpoint(plain.checkpoint).model_state
    b = load_checkpoint(evaluated.checkpoint).model_state
    assert all(torch.equal(a[k], b[k]) for k in a)
    lines = (tmp_path / "with_eval").glob("*.jsonl")
    assert not list(lines)  # no JSONL configured: nothing written


def test_eval_events_reach_jsonl(tiny, text_file):
    tiny["data"].update(text_path=str(text_file), eval_fraction=0.1, eval_every=2)
    tiny["logging"]["json_file"] = "m.jsonl"
    train_from_config(tiny, console=False)
    path = os.path.join(tiny["run"]["output_dir"], "m.jsonl")
    records = [json.loads(line) for line in open(path)]
    assert [r["step"] for r in records if r["event"] == "eval"] == [2, 4, 6]


def test_data_stream_resumes_token_file_mid_epoch(text_file, tmp_path):
    out = tmp_path / "c.bin"
    tokenize_file(text_file, out, ByteTokenizer())
    cfg = SpeedtronicConfig.from_dict(
        {"model": {"seq_len": 16}, "data": {"token_path": str(out), "micro_batch_size": 4}}
    )
    first = DataStream(build_dataloader(cfg))
    head = [next(first)["input_ids"] for _ in range(5)]
    straight = DataStream(build_dataloader(cfg))
    expected = [next(straight)["input_ids"] for _ in range(9)]
    resumed = DataStream(build_dataloader(cfg))
    resumed.load_state_dict(first.state_dict())
    tail = [next(resumed)["input_ids"] for _ in range(4)]
    for a, b in zip(head + tail, expected, strict=True):
        assert torch.equal(a, b)


def test_data_tokenize_command_writes_a_token_file(text_file, tmp_path):
    out = tmp_path / "tokens.bin"
    result = CliRunner().invoke(app, ["data", "tokenize", str(text_file), str(out)])
    assert result.exit_code == 0, result.stderr
    assert "uint16 tokens" in result.stdout
    # a text file is one document: the byte tokenizer's separator (0x03) first (docs/data.md)
    assert np.fromfile(out, dtype=np.uint16).tolist() == [3, *text_file.read_bytes()]
    missing = CliRunner().invoke(app, ["data", "tokenize", str(tmp_path / "no.txt"), str(out)])
    assert missing.exit_code == 2 and "file not found" in missing.stderr


def test_data_tokenize_never_replaces_what_is_not_a_regular_file(text_file, tmp_path):
    # The output is renamed into place: a device such as /dev/null would have become a regular
    # file (found with /dev/full while checking issue 21). A FIFO stands in for the device.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result = CliRunner().invoke(app, ["data", "tokenize", str(text_file), str(fifo)])
    assert result.exit_code == 2
    assert f"{fifo} exists and is not a regular file" in result.stderr
    assert stat.S_ISFIFO(fifo.stat().st_mode) and not (tmp_path / "pipe.tmp").exists()

"""Training on a token-shard folder (issue 28): blocks across shard seams, exact resume, the DDP
split with no overlap, the held-out part as ``data.eval_path``, the vocabulary check, the
tokenizer the data layer reports for a checkpoint, and the corpora ``data.text_path`` refuses.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from ingest_support import documents, train_bpe, write_jsonl, write_parquet
from typer.testing import CliRunner

from speedtronic.cli.app import app
from speedtronic.config import SpeedtronicConfig
from speedtronic.data import DataStream, ResumableSampler, build_dataloader, build_datasets
from speedtronic.data.ingest.pipeline import tokenize_corpus
from speedtronic.data.ingest.plan import Request
from speedtronic.data.manifest import data_tokenizer
from speedtronic.data.shards import TokenShardBlocks
from speedtronic.data.tokenizer import ByteTokenizer, HFTokenizer
from speedtronic.errors import DataError
from speedtronic.runtime import train_from_config

runner = CliRunner()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """A byte-tokenized folder of 200 documents in shards of ~700 tokens (closed at the end of a
    row group of 10 documents), 10% held out."""
    root = tmp_path_factory.mktemp("shards")
    write_parquet(root / "docs.parquet", documents(200), row_group_size=10)
    request = Request((str(root / "docs.parquet"),), shard_tokens=700, val_fraction=0.1)
    tokenize_corpus(request, root / "tokens", workers=1)
    return root / "tokens"


def config(shards, **data) -> SpeedtronicConfig:
    return SpeedtronicConfig.from_dict(
        {
            "model": {"seq_len": 16},
            "data": {"token_path": str(shards), "micro_batch_size": 4, **data},
        }
    )


def concatenation(folder, part="train") -> np.ndarray:
    doc = json.loads((folder / "manifest.json").read_text())
    files = [folder / s["file"] for s in doc["parts"][part]]
    return np.concatenate([np.fromfile(f, dtype=doc["dtype"]) for f in files])


def test_blocks_read_the_shards_as_one_stream_across_their_seams(shards):
    train, _ = build_datasets(config(shards))
    assert isinstance(train, TokenShardBlocks) and len(train.paths) > 3
    flat = concatenation(shards)
    assert len(train) == (len(flat) - 1) // 16
    seam = train.starts[1]
    spanning = (seam - 5) // 16  # a block that starts before the first seam and ends after
    for index in (0, spanning, len(train) - 1):
        block = train[index]
        want = torch.as_tensor(flat[index * 16 : index * 16 + 17].astype(np.int64))
        assert torch.equal(block["input_ids"], want[:-1])
        assert torch.equal(block["labels"], want[1:])


def test_resume_is_exact_across_shards(shards):
    cfg = config(shards)
    first = DataStream(build_dataloader(cfg))
    head = [next(first)["input_ids"] for _ in range(7)]
    straight = DataStream(build_dataloader(cfg))
    expected = [next(straight)["input_ids"] for _ in range(15)]
    resumed = DataStream(build_dataloader(cfg))
    resumed.load_state_dict(first.state_dict())
    tail = [next(resumed)["input_ids"] for _ in range(8)]
    for a, b in zip(head + tail, expected, strict=True):
        assert torch.equal(a, b)


def test_ddp_ranks_split_the_shards_without_overlap(shards):
    train, _ = build_datasets(config(shards))
    seen = [list(ResumableSampler(len(train), True, 7, rank, 3)) for rank in range(3)]
    flat = [i for rank in seen for i in rank]
    assert len(flat) == len(set(flat)) == len(train) - len(train) % 3


def test_the_held_out_part_is_the_folder_as_eval_path(shards):
    train, held = build_datasets(config(shards, eval_path=str(shards), eval_every=2))
    val = concatenation(shards, "val")
    assert len(held) == (len(val) - 1) // 16
    assert torch.equal(held[0]["input_ids"], torch.as_tensor(val[:16].astype(np.int64)))
    _, fraction = build_datasets(config(shards, eval_fraction=0.1))
    assert len(fraction) == round(len(train) * 0.1)


def test_a_run_trains_on_the_folder(shards, tiny):
    tiny["model"]["vocab_size"] = 256
    tiny["data"].update(token_path=str(shards), eval_path=str(shards), eval_every=3)
    result = train_from_config(tiny, console=False)
    assert result.steps == 6 and np.isfinite(result.final_loss)


def test_the_vocabulary_check_stays(shards, tmp_path):
    with pytest.raises(DataError, match="model.vocab_size: 64 is smaller than the vocabulary"):
        build_datasets(
            SpeedtronicConfig.from_dict(
                {"model": {"vocab_size": 64, "seq_len": 16}, "data": {"token_path": str(shards)}}
            )
        )
    folder = tmp_path / "copy"
    folder.mkdir()
    for path in shards.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    first = json.loads((folder / "manifest.json").read_text())["parts"]["train"][1]["file"]
    data = bytearray((folder / first).read_bytes())
    data[10:12] = (300).to_bytes(2, "little")  # an id the byte vocabulary cannot have
    (folder / first).write_bytes(bytes(data))
    with pytest.raises(DataError, match=f"shard {folder / first} has sha256"):
        build_datasets(config(folder))  # issue 35: the manifest's sha256 is checked first
    doc = json.loads((folder / "manifest.json").read_text())
    doc["parts"]["train"][1]["sha256"] = hashlib.sha256(data).hexdigest()  # a manifest that
    (folder / "manifest.json").write_text(json.dumps(doc))  # agrees: the id check still runs
    with pytest.raises(DataError, match=f"{first} has token id 300 at position 5"):
        build_datasets(config(folder))


def test_an_unfinished_or_damaged_folder_is_refused(shards, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    (tmp_path / "bare.partial").mkdir()
    with pytest.raises(DataError, match="without manifest.json.*bare.partial holds an unfinished"):
        build_datasets(config(bare))
    cut = tmp_path / "cut"
    cut.mkdir()
    for path in shards.iterdir():
        (cut / path.name).write_bytes(path.read_bytes())
    (cut / "train_00001.bin").write_bytes(b"\0\0")
    with pytest.raises(DataError, match="shard .*train_00001.bin is 2 bytes, the manifest says"):
        build_datasets(config(cut))
    with pytest.raises(DataError, match="holds uint16 tokens"):
        build_datasets(config(shards, token_dtype="uint32"))


def test_the_data_layer_reports_the_tokenizer_the_data_was_made_with(shards, tmp_path):
    assert isinstance(data_tokenizer(config(shards)), ByteTokenizer)
    bpe = train_bpe(tmp_path / "bpe.json", vocab_size=400)
    write_jsonl(tmp_path / "d.jsonl", documents(30))
    tokenize_corpus(Request((str(tmp_path / "d.jsonl"),), str(bpe)), tmp_path / "t", workers=1)
    found = data_tokenizer(config(tmp_path / "t"))
    assert isinstance(found, HFTokenizer) and found.path == tmp_path / "t" / "tokenizer.json"
    assert found.vocab_size == 400
    flat = tmp_path / "flat.bin"
    tokenize_corpus(Request((str(tmp_path / "d.jsonl"),), flat=True), flat, workers=1)
    assert data_tokenizer(config(flat)) is None
    text = SpeedtronicConfig.from_dict({"data": {"text_path": "x.txt"}})
    assert isinstance(data_tokenizer(text), ByteTokenizer)
    assert data_tokenizer(SpeedtronicConfig.from_dict({})) is None


@pytest.mark.parametrize("name", ["c.jsonl", "c.parquet", "c.jsonl.gz"])
def test_a_corpus_file_as_text_path_is_refused_with_the_command(name, tiny, tmp_path):
    corpus = tmp_path / name
    corpus.write_bytes(b'{"text": "hello"}\n' * 100)
    tiny["data"]["text_path"] = str(corpus)
    (tmp_path / "c.yaml").write_text(json.dumps(tiny))
    result = runner.invoke(app, ["train", "-c", str(tmp_path / "c.yaml")])
    assert result.exit_code == 2
    assert f"data.text_path: {corpus} is " in result.stderr and "not plain text" in result.stderr
    assert f"hint: tokenize it first: speedtronic data tokenize {corpus} tokens" in result.stderr
    tiny["data"] = {"token_path": str(corpus)}
    (tmp_path / "c.yaml").write_text(json.dumps(tiny))
    as_tokens = runner.invoke(app, ["train", "-c", str(tmp_path / "c.yaml")])
    assert as_tokens.exit_code == 2 and "not tokens" in as_tokens.stderr


def test_a_run_on_shards_records_their_tokenizer_and_generate_decodes_with_it(tiny, tmp_path):
    """Issues 28 and 29 together: the manifest's tokenizer reaches the checkpoint (not
    'byte', as a token-file run recorded before), and generate encodes and decodes with it."""
    from speedtronic.checkpoint.layout import TOKENIZER_FILE, read_latest

    bpe = train_bpe(tmp_path / "bpe.json", vocab_size=300, corpus_bytes=1 << 16)
    write_jsonl(tmp_path / "d.jsonl", documents(120))
    tokenize_corpus(Request((str(tmp_path / "d.jsonl"),), str(bpe)), tmp_path / "t", workers=1)
    tiny["model"]["vocab_size"] = 320
    tiny["data"].update(token_path=str(tmp_path / "t"))
    tiny["run"]["output_dir"] = str(tmp_path / "run")
    train_from_config(tiny, console=False)
    root = tmp_path / "run" / "checkpoints"
    checkpoint = root / read_latest(root)
    meta = json.loads((checkpoint / "meta.json").read_text())
    assert meta["tokenizer"]["kind"] == "tokenizers" and meta["tokenizer"]["vocab_size"] == 300
    assert (checkpoint / TOKENIZER_FILE).read_bytes() == bpe.read_bytes()
    prompt = "import os"
    out = runner.invoke(
        app,
        [
            "generate",
            str(tmp_path / "run"),
            "--prompt",
            prompt,
            "--max-new-tokens",
            "4",
            "--temperature",
            "0",
            "--format",
            "json",
        ],
    )
    assert out.exit_code == 0, out.output
    sample, tokenizer = json.loads(out.stdout.strip().splitlines()[-1]), HFTokenizer(bpe)
    assert sample["prompt_tokens"] == len(tokenizer(prompt)) < len(prompt)  # BPE merges
    assert sample["completion"] == tokenizer.decode(sample["tokens"])

"""A token folder records the UTF-8 bytes of text behind each shard (issue 53, item 8), so a run
on it reports bits per byte for its held-out split: counted per document as it is encoded, so
the count holds across a resumed and a capped tokenize; a manifest without them stays readable.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from ingest_support import documents, train_bpe, write_jsonl, write_parquet

from speedtronic.config import SpeedtronicConfig
from speedtronic.data.ingest.encode import held_out
from speedtronic.data.ingest.pipeline import tokenize_corpus
from speedtronic.data.ingest.plan import Request
from speedtronic.data.loader import build_datasets, bytes_per_token
from speedtronic.data.manifest import read_manifest, text_bytes
from speedtronic.runtime import train_from_config

pytest.importorskip("pyarrow")


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return train_bpe(tmp_path_factory.mktemp("tok") / "tokenizer.json", 300, 1 << 18)


@pytest.fixture
def corpus(tmp_path):
    """60 documents: a.jsonl (20), c.parquet (25, row groups of 7), and a text file (one)."""
    docs = documents(60)
    src = tmp_path / "src"
    src.mkdir()
    write_jsonl(src / "a.jsonl", docs[:20])
    write_parquet(src / "c.parquet", docs[20:45], row_group_size=7)
    text = "\n".join(docs[45:])
    (src / "d.txt").write_text(text, encoding="utf-8")
    return src, docs[:45] + [text]


def utf8(docs) -> int:
    return sum(len(d.encode("utf-8")) for d in docs)


def shard_bytes(out, part: str) -> list[int]:
    return [s["bytes"] for s in read_manifest(out, "out")["parts"][part]]


@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
def test_each_shard_records_the_bytes_of_its_documents_text(corpus, bpe, tokenizer, tmp_path):
    from tokenizers import Tokenizer

    src, docs = corpus
    name = str(bpe) if tokenizer == "bpe" else "byte"
    request = Request((str(src),), name, val_fraction=0.2, shard_tokens=400)
    tokenize_corpus(request, tmp_path / "out", workers=1)
    doc = read_manifest(tmp_path / "out", "out")
    assert len(doc["parts"]["train"]) > 2 and doc["parts"]["val"]
    val = [d for d in docs if held_out(d, 0.2)]
    assert sum(shard_bytes(tmp_path / "out", "val")) == utf8(val)
    assert sum(shard_bytes(tmp_path / "out", "train")) == utf8(docs) - utf8(val)
    for part in ("train", "val"):
        for shard in doc["parts"][part]:  # each shard's own: its tokens decode to that many
            ids = np.fromfile(tmp_path / "out" / shard["file"], dtype=doc["dtype"]).tolist()
            if tokenizer == "bpe":
                text = Tokenizer.from_file(str(bpe)).decode(ids, skip_special_tokens=True)
                assert len(text.encode("utf-8")) == shard["bytes"]
            else:
                assert len(ids) - ids.count(3) == shard["bytes"]


def interrupt_tokenize(request, out):
    """Tokenize into ``out`` until its fourth progress report, then stop as a Ctrl-C does."""
    seen = []

    def stop_after_a_while(snapshot):
        seen.append(snapshot)
        if len(seen) == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokenize_corpus(request, out, workers=1, on_progress=stop_after_a_while)


def test_a_resumed_tokenize_counts_each_byte_once(corpus, bpe, tmp_path):
    src, docs = corpus
    request = Request((str(src),), str(bpe), shard_tokens=400, val_fraction=0.2)
    tokenize_corpus(request, tmp_path / "straight", workers=1)
    interrupt_tokenize(request, tmp_path / "cut")
    tokenize_corpus(request, tmp_path / "cut", workers=1)
    for part in ("train", "val"):
        assert shard_bytes(tmp_path / "cut", part) == shard_bytes(tmp_path / "straight", part)
    both = shard_bytes(tmp_path / "cut", "train") + shard_bytes(tmp_path / "cut", "val")
    assert sum(both) == utf8(docs)


def test_a_journal_from_before_the_bytes_leaves_the_open_shards_bytes_unknown(corpus, tmp_path):
    src, _ = corpus
    request = Request((str(src),), shard_tokens=4000)
    interrupt_tokenize(request, tmp_path / "out")
    path = tmp_path / "out.partial" / "progress.json"
    journal = json.loads(path.read_text())
    states = [journal["parts"], (journal.get("file_start") or {}).get("parts", {})]
    for parts in states:
        for state in parts.values():
            state.pop("open_bytes", None)
            for record in state["closed"]:
                record.pop("bytes", None)
    assert journal["parts"]["train"]["open_tokens"] > 0
    path.write_text(json.dumps(journal))
    tokenize_corpus(request, tmp_path / "out", workers=1)
    doc = read_manifest(tmp_path / "out", "out")
    train = doc["parts"]["train"]
    assert "bytes" not in train[len(journal["parts"]["train"]["closed"])]  # never a wrong count
    assert "bytes" in train[-1] and text_bytes(doc, "train") is None


def test_a_capped_tokenize_counts_the_documents_it_kept(corpus, tmp_path):
    src, docs = corpus
    ends = [sum(len(d.encode("utf-8")) + 1 for d in docs[: i + 1]) for i in range(len(docs))]
    request = Request((str(src),), max_tokens=ends[30] - 5)  # inside document 30
    report = tokenize_corpus(request, tmp_path / "out", workers=1)
    assert report["capped"] and report["documents"] == 31
    assert sum(shard_bytes(tmp_path / "out", "train")) == utf8(docs[:31])


def folder(tmp_path, bpe, **request) -> tuple:
    """200 documents in row groups of 10 (a shard closes at a group's end), BPE-tokenized."""
    write_parquet(tmp_path / "docs.parquet", documents(200, seed=1), row_group_size=10)
    out, name = tmp_path / "tokens", str(tmp_path / "docs.parquet")
    tokenize_corpus(Request((name,), str(bpe), **request), out, workers=1)
    return out, read_manifest(out, "out")


def summary_of(tiny, out, **data) -> dict:
    tiny["model"]["vocab_size"] = 300
    tiny["data"].update(token_path=str(out), eval_every=3, **data)
    train_from_config(tiny, console=False)
    return json.loads((Path(tiny["run"]["output_dir"]) / "summary.json").read_text())


def test_a_run_on_the_folders_held_out_part_has_bits_per_byte_from_its_bytes(bpe, tiny, tmp_path):
    out, doc = folder(tmp_path, bpe, val_fraction=0.2)
    (val,) = doc["parts"]["val"]  # one shard, wholly scored: the exact figure
    val_set = summary_of(tiny, out, eval_path=str(out))["eval"]["val"]
    want = val_set["loss"] / math.log(2) * val["tokens"] / val["bytes"]
    assert val_set["bits_per_byte"] == pytest.approx(want, rel=1e-9)


def test_eval_fraction_of_a_folder_has_bits_per_byte_of_the_shard_it_scores(bpe, tiny, tmp_path):
    out, doc = folder(tmp_path, bpe)
    (train,) = doc["parts"]["train"]
    val_set = summary_of(tiny, out, eval_fraction=0.1)["eval"]["val"]
    want = val_set["loss"] / math.log(2) * train["tokens"] / train["bytes"]
    assert val_set["bits_per_byte"] == pytest.approx(want, rel=1e-9)


def test_the_bytes_per_token_are_those_of_the_shards_the_evaluation_reads(bpe, tmp_path):
    out, doc = folder(tmp_path, bpe, shard_tokens=2000)
    shards = doc["parts"]["train"]
    assert len(shards) > 4
    config = SpeedtronicConfig.from_dict(
        {
            "model": {"seq_len": 16, "vocab_size": 300},
            "data": {"token_path": str(out), "micro_batch_size": 4, "eval_fraction": 0.1},
        }
    )
    _, held = build_datasets(config)
    first, last = held.start * 16, (held.start + 8) * 16  # 8 blocks: two batches of four
    starts = [sum(s["tokens"] for s in shards[:i]) for i in range(len(shards) + 1)]
    read = [
        s for s, a, b in zip(shards, starts, starts[1:], strict=False) if a <= last and b > first
    ]
    assert 0 < len(read) < len(shards)
    want = sum(s["bytes"] for s in read) / sum(s["tokens"] for s in read)
    assert bytes_per_token(held, 8 * 16)() == pytest.approx(want)


def test_a_manifest_without_bytes_is_read_and_has_no_bits_per_byte(bpe, tiny, tmp_path):
    out, _ = folder(tmp_path, bpe, val_fraction=0.2)
    doc = json.loads((out / "manifest.json").read_text())
    for part in doc["parts"].values():
        for shard in part:
            del shard["bytes"]
    (out / "manifest.json").write_text(json.dumps(doc))
    val_set = summary_of(tiny, out, eval_path=str(out))["eval"]["val"]
    assert val_set["bits_per_byte"] is None and val_set["loss"] > 0

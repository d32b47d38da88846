"""``runs compare`` compares tokenizers by identity (issue 53 item 7): a run and its copy
without summary.json (as a kill -9 leaves it) read their tokenizer from summary.json and from
meta.json; summary.json's record left out the special tokens meta.json keeps, the two were
compared as JSON and called "different tokenizers". summary.json now carries meta.json's
identity, and compare asks ``checkpoint.tokenizer.same_tokenizer``."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from modelout_support import train_text, write_bpe

from speedtronic.checkpoint.tokenizer import tokenizer_record
from speedtronic.data.tokenizer import HFTokenizer
from speedtronic.observe.summary import _tokenizer as summary_record
from speedtronic.results.compare import compare_runs
from tests.results.test_runs import summary, write_checkpoint, write_summary

pytest.importorskip("tokenizers")
SPECIALS = {
    "bos_token": "<bos>",
    "chat_template": "{{ messages }}",
    "config_ids": {"bos_token_id": 0},
}


def test_a_run_and_its_copy_without_summary_have_one_tokenizer(tmp_path):
    tokenizer = HFTokenizer(write_bpe(tmp_path))
    tokenizer.specials = SPECIALS  # what a run from an imported model records
    meta = tokenizer_record(tokenizer)[0]
    runtime = SimpleNamespace(checkpoints=SimpleNamespace(tokenizer_meta=meta))
    config = {"optimizer": {"name": "adamw", "lr": 0.001}, "model": {"vocab_size": 320}}
    a = write_summary(tmp_path / "a", summary(tokenizer=summary_record(runtime), config=config))
    b = write_checkpoint(tmp_path / "b", 100, config, tokenizer=meta)
    (b / "metrics.jsonl").write_text(
        json.dumps({"event": "train_step", "step": 100, "tokens": 12800, "loss": 3.0}) + "\n"
    )
    doc = compare_runs([a, b], "steps")
    assert (doc["metric"], doc["note"]) == ("loss", None)
    assert {s["kind"] for s in doc["series"]} == {"train", "eval"}


def test_another_tokenizer_of_the_same_size_is_still_another(tmp_path):
    (tmp_path / "other").mkdir()
    ours = tokenizer_record(HFTokenizer(write_bpe(tmp_path)))[0]
    theirs = tokenizer_record(HFTokenizer(write_bpe(tmp_path / "other", template_bos=True)))[0]
    a = write_summary(tmp_path / "a", summary(tokenizer=ours))
    b = write_summary(tmp_path / "b", summary(tokenizer=theirs))
    assert compare_runs([a, b], "steps")["metric"] == "bits_per_byte"


def test_summary_json_records_the_identity_meta_json_has(tmp_path):
    run = train_text(tmp_path, str(write_bpe(tmp_path)))
    record = json.loads((run / "summary.json").read_text())["tokenizer"]
    latest = json.loads((run / "checkpoints" / "latest.json").read_text())["path"]
    meta = json.loads((run / "checkpoints" / latest / "meta.json").read_text())["tokenizer"]
    assert record["identity"] and record["identity"] == meta["identity"]

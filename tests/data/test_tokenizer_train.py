"""``speedtronic data tokenizer train`` (issue 40): a byte-level BPE tokenizer trained on the
sources ``data tokenize`` reads, its compression measured on held-out documents, a result that
``data tokenize --tokenizer OUT`` and training take as it is, and OUT owned like tokenize's."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from ingest_support import documents, train_bpe, write_jsonl, write_parquet
from typer.testing import CliRunner

from speedtronic.cli.app import app
from speedtronic.data.ingest.encode import held_out
from speedtronic.runtime import train_from_config

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("pyarrow")
runner = CliRunner()


def train(*args: str):
    return runner.invoke(app, ["data", "tokenizer", "train", *args])


@pytest.fixture
def corpus(tmp_path):
    """Four formats read as tokenize reads them: JSON Lines (plain, .gz), Parquet, text."""
    docs = documents(300)
    src = tmp_path / "src"
    src.mkdir()
    write_jsonl(src / "a.jsonl", docs[:120])
    write_jsonl(src / "b.jsonl.gz", docs[120:200])
    write_parquet(src / "c.parquet", docs[200:290], row_group_size=40)
    (src / "d.txt").write_text("\n".join(docs[290:]), encoding="utf-8")
    return src, docs[:290] + ["\n".join(docs[290:])]


def test_a_trained_tokenizer_compresses_held_out_text_and_tokenize_and_train_take_it(
    corpus, tmp_path, tiny
):
    src, docs = corpus
    out, gpt2ish = tmp_path / "mine.json", train_bpe(tmp_path / "other.json", vocab_size=300)
    args = [str(src), str(out), "--vocab-size", "400", "--held-out", "0.2"]
    result = train(*args, "--compare", str(gpt2ish), "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    held = [d for d in docs if held_out(d, 0.2)]
    assert report["files"] == 4 and report["vocab_size"] == 400
    assert report["held_out_documents"] == len(held) > 0
    assert report["documents"] == len(docs) - len(held)
    tok = tokenizers.Tokenizer.from_file(str(out))
    assert tok.token_to_id("<|endoftext|>") == 0 and tok.get_vocab_size() == 400
    size = sum(len(d.encode()) for d in held)
    for path, key in ((out, "bytes_per_token"), (gpt2ish, "compare_bytes_per_token")):
        ids = tokenizers.Tokenizer.from_file(str(path)).encode_batch(held)
        assert report[key] == pytest.approx(size / sum(len(e.ids) for e in ids))
    assert report["bytes_per_token"] > 2.5  # merges learnt from these words, not bytes (1.0)
    assert all(tok.decode(tok.encode(d).ids) == d for d in held)  # byte-level: lossless
    tokenized = runner.invoke(
        app, ["data", "tokenize", str(src), str(tmp_path / "t"), "--tokenizer", str(out)]
    )
    assert tokenized.exit_code == 0, tokenized.output
    manifest = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert manifest["separator"]["tokens"] == ["<|endoftext|>"]
    assert manifest["separator"]["before"] == [0] and manifest["counts"]["vocab_size"] == 400
    tiny["model"]["vocab_size"] = 400
    tiny["data"].update(token_path=str(tmp_path / "t"))
    run = train_from_config(tiny, console=False)
    assert run.steps > 0 and np.isfinite(run.final_loss)


def test_the_summary_names_both_ratios(corpus, tmp_path):
    src, _ = corpus
    other = train_bpe(tmp_path / "other.json", vocab_size=300, corpus_bytes=1 << 16)
    out = tmp_path / "mine.json"
    args = ["--vocab-size", "300", "--compare", str(other)]
    result = train(str(src), str(out), *args, "--held-out", "0.1")
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith(f"wrote {out} (vocab 300, separator <|endoftext|> id 0)")
    assert f"tokenize with --tokenizer {out}" in lines[0]
    assert lines[-1].startswith("compression: ") and f"; {other}: " in lines[-1]
    assert "bytes/token on " in lines[-1] and "held-out bytes" in lines[-1]
    none = train(str(src), str(out), *args, "--held-out", "0")  # nothing to measure on: said
    assert none.stdout.strip().splitlines()[-1] == (
        "compression: not measured (no document fell in the held-out slice; raise --held-out)"
    )


def test_special_tokens_follow_the_separator(corpus, tmp_path):
    src, _ = corpus
    out = tmp_path / "mine.json"
    result = train(str(src), str(out), "--vocab-size", "300", "--special", "<|pad|>")
    assert result.exit_code == 0, result.output
    tok = tokenizers.Tokenizer.from_file(str(out))
    assert [tok.token_to_id(t) for t in ("<|endoftext|>", "<|pad|>")] == [0, 1]
    assert tok.encode("a<|pad|>b").ids[1] == 1  # one token, not its bytes


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--vocab-size", "256"], "--vocab-size: must be in [257, 1048576]"),
        (["--vocab-size", str(2**20 + 1)], "--vocab-size: must be in [257, 1048576]"),
        (["--vocab-size", "300", "--held-out", "1"], "--held-out: must be in [0, 1)"),
        (["--vocab-size", "300", "--compare", "nope.json"], "--compare: file not found: nope"),
    ],
)
def test_bad_options_are_one_line(corpus, tmp_path, args, line):
    src, _ = corpus
    result = train(str(src), str(tmp_path / "mine.json"), *args)
    assert result.exit_code == 2 and result.stderr.startswith(f"speedtronic: error: {line}")
    assert "Traceback" not in result.output and not (tmp_path / "mine.json").exists()


def test_bad_input_names_its_file_and_writes_nothing(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", documents(50))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": oops}\n', encoding="utf-8")
    out = tmp_path / "mine.json"
    result = train(str(good), str(bad), str(out), "--vocab-size", "300")
    assert result.exit_code == 2 and "bad.jsonl: the line at byte 17" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()
    missing = train(str(tmp_path / "none.jsonl"), str(out), "--vocab-size", "300")
    assert missing.exit_code == 2 and "none.jsonl: file not found" in missing.stderr


def test_out_is_replaced_only_when_this_command_wrote_it(corpus, tmp_path):
    src, _ = corpus
    theirs = tmp_path / "tokenizer.json"
    theirs.write_text("my notes", encoding="utf-8")
    refused = train(str(src), str(theirs), "--vocab-size", "300")
    assert refused.exit_code == 2 and "was not written by data tokenizer train" in refused.stderr
    assert theirs.read_text(encoding="utf-8") == "my notes"
    mine = tmp_path / "mine.json"
    assert train(str(src), str(mine), "--vocab-size", "300").exit_code == 0
    again = train(str(src), str(mine), "--vocab-size", "320")
    assert again.exit_code == 0, again.output
    assert tokenizers.Tokenizer.from_file(str(mine)).get_vocab_size() == 320
    mine.write_text(mine.read_text(encoding="utf-8") + " ", encoding="utf-8")  # edited since
    edited = train(str(src), str(mine), "--vocab-size", "300")
    assert edited.exit_code == 2 and "(or changed since)" in edited.stderr
    not_json = train(str(src), str(tmp_path / "mine.txt"), "--vocab-size", "300")
    assert not_json.exit_code == 2 and "name a .json file" in not_json.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".mine")) == [
        ".mine.json.tokenizer-train.json"
    ]  # no temporary file left


def test_a_second_writer_of_the_same_out_is_refused(corpus, tmp_path):
    from speedtronic.data.ingest.owner import OutLock

    src, _ = corpus
    out = tmp_path / "mine.json"
    with OutLock(out, "data tokenizer train"):
        result = train(str(src), str(out), "--vocab-size", "300")
    assert result.exit_code == 2 and not out.exists()
    assert f"{out}: another data tokenizer train is writing it" in result.stderr
    assert train(str(src), str(out), "--vocab-size", "300").exit_code == 0  # the lock is gone


def test_without_tokenizers_it_is_one_line(corpus, tmp_path, monkeypatch):
    src, _ = corpus
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    result = train(str(src), str(tmp_path / "mine.json"), "--vocab-size", "300")
    assert result.exit_code == 2
    assert result.stderr.startswith("speedtronic: error: data tokenizer train needs the ")
    assert "pip install 'speedtronic[data]'" in result.stderr

"""``speedtronic data tokenize`` on local corpora: every format, the documented token counts, the
held-out part, the token cap, workers that keep the order, resume after an interruption, and
bad input as one line with exit 2 (issue 28).

The token count is the documented rule, recomputed here with ``tokenizers`` itself: for each
document, the separator (``<|endoftext|>``; byte 0x03 for the byte tokenizer), then its ids.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ingest_support import (
    documents,
    expected_tokens,
    train_bpe,
    write_jsonl,
    write_parquet,
)
from typer.testing import CliRunner

from speedtronic.cli.app import app
from speedtronic.data.ingest.encode import held_out
from speedtronic.data.ingest.pipeline import tokenize_corpus
from speedtronic.data.ingest.plan import Request
from speedtronic.data.manifest import read_manifest

runner = CliRunner()
pytest.importorskip("pyarrow")


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return train_bpe(tmp_path_factory.mktemp("tok") / "tokenizer.json", vocab_size=600)


@pytest.fixture
def corpus(tmp_path):
    """Three formats, 60 documents: a.jsonl (20), b.jsonl.gz (15), c.parquet (25)."""
    docs = documents(60)
    src = tmp_path / "src"
    src.mkdir()
    write_jsonl(src / "a.jsonl", docs[:20])
    write_jsonl(src / "b.jsonl.gz", docs[20:35])
    write_parquet(src / "c.parquet", docs[35:], row_group_size=7)
    return src, docs


def tokenize(*args: str):
    """The command, on one worker unless told (spawning processes is for the workers test)."""
    workers = [] if "--workers" in args else ["--workers", "1"]
    return runner.invoke(app, ["data", "tokenize", *args, *workers])


def train_tokens(out) -> list[int]:
    doc = read_manifest(out, "out")
    ids = [np.fromfile(out / s["file"], dtype=doc["dtype"]) for s in doc["parts"]["train"]]
    return np.concatenate(ids).tolist()


def test_formats_a_directory_and_a_glob_give_the_documented_tokens(corpus, bpe, tmp_path):
    src, docs = corpus
    want = expected_tokens(docs, bpe, separator=0)
    by_dir = tokenize(str(src), str(tmp_path / "dir"), "--tokenizer", str(bpe))
    assert by_dir.exit_code == 0, by_dir.stderr
    assert train_tokens(tmp_path / "dir") == want
    files = [str(src / n) for n in ("a.jsonl", "b.jsonl.gz", "c.parquet")]
    listed = tokenize(*files, str(tmp_path / "list"), "--tokenizer", str(bpe), "--format", "json")
    report = json.loads(listed.stdout)
    assert report["tokens"] == len(want) and report["documents"] == 60 and report["files"] == 3
    assert report["dtype"] == "uint16" and report["vocab_size"] == 600
    assert report["out"] == str(tmp_path / "list")
    globbed = tokenize(str(src / "*.*"), str(tmp_path / "glob"), "--tokenizer", str(bpe))
    assert globbed.exit_code == 0, globbed.stderr
    assert train_tokens(tmp_path / "glob") == want
    manifest = read_manifest(tmp_path / "glob", "out")
    assert [s["name"] for s in manifest["sources"]] == files
    assert manifest["separator"]["tokens"] == ["<|endoftext|>"]
    assert (tmp_path / "glob" / "tokenizer.json").read_bytes() == bpe.read_bytes()


def test_byte_tokenizer_puts_etx_before_each_document(corpus, tmp_path):
    src, docs = corpus
    result = tokenize(str(src / "a.jsonl"), str(tmp_path / "out"))
    assert result.exit_code == 0, result.stderr
    assert train_tokens(tmp_path / "out") == expected_tokens(docs[:20], None, separator=3)


def test_more_workers_write_the_same_bytes(corpus, bpe, tmp_path):
    src, _ = corpus
    for workers in ("1", "2"):
        args = ["--tokenizer", str(bpe), "--workers", workers, "--shard-tokens", "500"]
        assert tokenize(str(src), str(tmp_path / workers), *args).exit_code == 0
    one, two = read_manifest(tmp_path / "1", "x"), read_manifest(tmp_path / "2", "x")
    assert one["parts"] == two["parts"] and len(one["parts"]["train"]) > 3
    for shard in one["parts"]["train"]:
        assert (tmp_path / "1" / shard["file"]).read_bytes() == (
            tmp_path / "2" / shard["file"]
        ).read_bytes()


def test_the_held_out_part_is_chosen_by_document_content(corpus, bpe, tmp_path):
    src, docs = corpus
    args = ["--tokenizer", str(bpe), "--val-fraction", "0.3"]
    assert tokenize(str(src), str(tmp_path / "out"), *args).exit_code == 0
    doc = read_manifest(tmp_path / "out", "x")
    val_docs = [d for d in docs if held_out(d, 0.3)]
    assert 5 < len(val_docs) < 35
    val = np.fromfile(tmp_path / "out" / doc["parts"]["val"][0]["file"], dtype="uint16")
    assert val.tolist() == expected_tokens(val_docs, bpe, separator=0)
    assert train_tokens(tmp_path / "out") == expected_tokens(
        [d for d in docs if not held_out(d, 0.3)], bpe, separator=0
    )
    assert doc["counts"]["val_documents"] == len(val_docs)
    # the same documents in another order, another file: the same split
    write_jsonl(tmp_path / "shuffled.jsonl", docs[::-1])
    again = tokenize(str(tmp_path / "shuffled.jsonl"), str(tmp_path / "again"), *args)
    assert again.exit_code == 0
    assert read_manifest(tmp_path / "again", "x")["counts"]["val_documents"] == len(val_docs)


def test_max_tokens_stops_at_the_end_of_the_document_that_reaches_it(corpus, bpe, tmp_path):
    src, docs = corpus
    want = expected_tokens(docs, bpe, separator=0)
    ends = np.cumsum([len(expected_tokens([d], bpe, 0)) for d in docs])
    cap = int(ends[30]) - 5  # inside document 30 (in b.jsonl.gz)
    args = ["--tokenizer", str(bpe), "--max-tokens", str(cap), "--format", "json"]
    report = json.loads(tokenize(str(src), str(tmp_path / "out"), *args).stdout)
    assert report["capped"] and report["tokens"] == int(ends[30]) and report["documents"] == 31
    assert train_tokens(tmp_path / "out") == want[: int(ends[30])]
    assert report["files"] == 2  # c.parquet was never opened


def test_a_flat_bin_output_is_one_token_file_and_replaces_an_old_one(corpus, tmp_path):
    src, docs = corpus
    out = tmp_path / "tokens.bin"
    out.write_bytes(b"old")
    result = tokenize(str(src / "a.jsonl"), str(out))
    assert result.exit_code == 0 and "uint16 tokens" in result.stdout
    assert np.fromfile(out, dtype=np.uint16).tolist() == expected_tokens(docs[:20], None, 3)
    assert not (tmp_path / "tokens.bin.partial").exists()


def test_a_finished_output_is_not_redone_and_a_different_one_not_replaced(corpus, tmp_path):
    src, _ = corpus
    out = tmp_path / "out"
    assert tokenize(str(src / "a.jsonl"), str(out)).exit_code == 0
    again = tokenize(str(src / "a.jsonl"), str(out))
    assert again.exit_code == 0 and "already complete" in again.stdout
    other = tokenize(str(src / "c.parquet"), str(out))
    assert other.exit_code == 2 and f"{out} exists" in other.stderr


def test_an_interrupted_tokenize_resumes_to_identical_bytes(corpus, bpe, tmp_path):
    src, _ = corpus
    request = Request((str(src),), str(bpe), shard_tokens=400, val_fraction=0.2)
    tokenize_corpus(request, tmp_path / "straight", workers=1)
    seen = []

    def stop_after_a_while(snapshot):
        seen.append(snapshot)
        if len(seen) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokenize_corpus(request, tmp_path / "cut", workers=1, on_progress=stop_after_a_while)
    journal = json.loads((tmp_path / "cut.partial" / "progress.json").read_text())
    assert journal["next"] != [0, 0] and not (tmp_path / "cut").exists()
    report = tokenize_corpus(request, tmp_path / "cut", workers=1)
    assert report["tokens"] == read_manifest(tmp_path / "straight", "x")["counts"]["tokens"]
    names = sorted(p.name for p in (tmp_path / "straight").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "cut").iterdir())
    for name in names:
        assert (tmp_path / "straight" / name).read_bytes() == (tmp_path / "cut" / name).read_bytes()


def test_a_resume_with_other_options_is_refused(corpus, tmp_path):
    src, _ = corpus
    request = Request((str(src),), shard_tokens=400)
    calls = []

    def stop(_):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokenize_corpus(request, tmp_path / "out", workers=1, on_progress=stop)
    result = tokenize(str(src), str(tmp_path / "out"), "--column", "body")
    assert result.exit_code == 2
    assert "was started with column = 'text', not 'body'" in result.stderr


BAD = {
    "not_object": (b'{"text": "a"}\n[1, 2]\n', "x.jsonl", "the line at byte 14 is an array"),
    "no_field": (
        b'{"text": "a"}\n{"body": "b", "url": "u"}\n',
        "x.jsonl",
        "has no field 'text' (its fields: body, url)",
    ),
    "utf8": (b'{"text": "a"}\n{"text": "caf\xe9"}\n', "x.jsonl", "not valid UTF-8 at byte 27"),
    "json": (b'{"text": "a"}\n{"text": \n', "x.jsonl", "the line at byte 14 is not JSON"),
    "text_utf8": (b"ab\xffcd", "x.txt", "not valid UTF-8 at byte 2"),
    "empty": (b"\n\n", "x.jsonl", "the sources hold no documents"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_naming_the_file_and_exit_2(case, tmp_path):
    data, name, expected = BAD[case]
    path = tmp_path / name
    path.write_bytes(data)
    result = tokenize(str(path), str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("speedtronic:")]
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert case == "empty" or str(path) in lines[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_parquet_missing_column_damage_and_empty_glob_are_one_line(corpus, tmp_path):
    src, _ = corpus
    parquet = src / "c.parquet"
    missing = tokenize(str(parquet), str(tmp_path / "o1"), "--column", "body")
    assert missing.exit_code == 2
    assert f"{parquet}: no column 'body' (its columns: text, id, dump, url," in missing.stderr
    numbers = tokenize(str(parquet), str(tmp_path / "o2"), "--column", "int_score")
    assert numbers.exit_code == 2 and "holds int64, not text" in numbers.stderr
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(parquet.read_bytes()[:2000])
    damaged = tokenize(str(cut), str(tmp_path / "o3"))
    assert damaged.exit_code == 2 and f"{cut}: not a readable Parquet file" in damaged.stderr
    glob = tokenize(str(tmp_path / "none" / "*.parquet"), str(tmp_path / "o4"))
    assert glob.exit_code == 2 and "no file matches this glob" in glob.stderr
    assert not list(tmp_path.glob("o*"))


def test_a_damaged_row_group_keeps_the_files_before_it(corpus, tmp_path):
    src, docs = corpus
    good = write_parquet(tmp_path / "1_good.parquet", docs[:30], row_group_size=10)
    raw = bytearray(write_parquet(tmp_path / "2_bad.parquet", docs[30:], 10).read_bytes())
    raw[200:900] = b"\x00" * 700  # inside the first row group's pages
    (tmp_path / "2_bad.parquet").write_bytes(bytes(raw))
    result = tokenize(str(good), str(tmp_path / "2_bad.parquet"), str(tmp_path / "out"))
    assert result.exit_code == 2 and "2_bad.parquet: row group 0 cannot be read" in result.stderr
    journal = json.loads((tmp_path / "out.partial" / "progress.json").read_text())
    assert journal["next"] == [1, 0] and journal["files"][0]["documents"] == 30


def test_the_separator_follows_the_tokenizer(tmp_path, bpe):
    from tokenizers import Tokenizer, processors

    from speedtronic.data.ingest.encode import choose_separator
    from speedtronic.errors import DataError

    tok = Tokenizer.from_file(str(bpe))
    assert choose_separator(tok, None, "x").before == (0,)
    tok.add_special_tokens(["<s>"])
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    templated = choose_separator(tok, None, "x")
    assert templated.before == (bos,) and templated.after == ()
    assert choose_separator(tok, "<s>", "x").rule == "--separator"
    with pytest.raises(DataError, match="is not a token of"):
        choose_separator(tok, "<nope>", "x")
    bare = Tokenizer.from_file(str(bpe))
    bare.post_processor = None
    vocab = {t: i for t, i in bare.get_vocab().items() if t != "<|endoftext|>"}
    from tokenizers import models

    plain = Tokenizer(models.WordLevel(vocab, unk_token=next(iter(vocab))))
    with pytest.raises(DataError, match="defines no document token"):
        choose_separator(plain, None, "plain.json")


def test_hub_specs_and_globs_are_read_as_the_hub_names_paths():
    from speedtronic.data.ingest.spec import matches, parse_hub
    from speedtronic.errors import DataError

    spec = parse_hub("hf://datasets/HuggingFaceFW/fineweb-edu/sample/10BT/*.parquet")
    assert (spec.repo, spec.revision, spec.pattern) == (
        "HuggingFaceFW/fineweb-edu",
        "main",
        "sample/10BT/*.parquet",
    )
    assert spec.literal_prefix == "sample/10BT"
    pinned = parse_hub("hf://datasets/o/n@refs%2Fconvert%2Fparquet/default/train")
    assert pinned.revision == "refs/convert/parquet" and pinned.literal_prefix == "default"
    assert parse_hub("hf://datasets/o/n").pattern == ""
    assert matches("sample/10BT/*.parquet", "sample/10BT/000_00000.parquet")
    assert not matches("sample/10BT/*.parquet", "sample/10BT/sub/000_00000.parquet")
    assert matches("**/*.jsonl.gz", "a/b/c.jsonl.gz") and matches("**/*.jsonl.gz", "c.jsonl.gz")
    assert matches("sample/10BT", "sample/10BT/x.parquet")
    assert not matches("sample/10BT", "sample/10BT2/x.parquet")
    assert matches("data/train-0000[0-2]-*.parquet", "data/train-00001-of-9.parquet")
    for bad in ("hf://o/n/x.parquet", "hf://datasets/o", "hf://datasets/o/n/../x"):
        with pytest.raises(DataError):
            parse_hub(bad)


def test_zstd_json_lines_and_a_text_file_read_like_the_rest(tmp_path, bpe):
    import pyarrow as pa

    docs = documents(25, seed=2)
    lines = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    with pa.CompressedOutputStream(str(tmp_path / "a.jsonl.zst"), "zstd") as f:
        f.write(lines)
    (tmp_path / "b.txt").write_text(docs[0], encoding="utf-8")
    args = [str(tmp_path / "a.jsonl.zst"), str(tmp_path / "b.txt"), str(tmp_path / "out")]
    result = tokenize(*args, "--tokenizer", str(bpe))
    assert result.exit_code == 0, result.stderr
    assert train_tokens(tmp_path / "out") == expected_tokens([*docs, docs[0]], bpe, separator=0)


def test_progress_goes_to_stderr_as_plain_lines_and_json_follows_the_conventions(corpus, tmp_path):
    from cli.test_json_conventions import checked

    src, _ = corpus
    result = tokenize(str(src), str(tmp_path / "out"), "--format", "json")
    assert result.exit_code == 0
    assert "tokenize: " in result.stderr and "tokens/s" in result.stderr and "ETA" in result.stderr
    doc = checked(json.loads(result.stdout))
    for key in ("tokens", "documents", "files", "out", "dtype", "vocab_size"):
        assert key in doc


def test_without_pyarrow_a_parquet_source_is_one_line_with_the_install_hint(
    corpus, tmp_path, monkeypatch
):
    import sys

    src, _ = corpus
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    result = tokenize(str(src / "c.parquet"), str(tmp_path / "out"))
    assert result.exit_code == 2
    assert "reading Parquet or .zst files needs the 'pyarrow' package" in result.stderr
    assert "hint: pip install 'speedtronic[data]'" in result.stderr
    jsonl = tokenize(str(src / "a.jsonl"), str(tmp_path / "fine"))  # other formats need none
    assert jsonl.exit_code == 0, jsonl.stderr


def test_a_worker_whose_parent_died_while_it_started_exits():
    """The slow tier's kill test once left a worker running for good: it ran its initializer
    after the tokenize was killed, so it took init's pid for its parent's and never saw it go.
    A worker is told its parent's pid and exits at once when that process is gone."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    code = (
        "import time; from speedtronic.data.ingest import work; "
        f"work._exit_with_parent({gone.pid}); time.sleep(120)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, timeout=90)
    assert (child.returncode, child.stderr) == (1, b"")


BROKEN_POOL = """
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from ingest_support import cut_result_and_die
from speedtronic.data.ingest import pool

if __name__ == "__main__":
    executor = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    try:
        pool.result(executor.submit(cut_result_and_die), executor)
    except BrokenProcessPool:
        print("broken")
"""


def test_a_worker_killed_while_it_sends_a_result_breaks_the_pool_and_the_exit_does_not_hang(
    tmp_path,
):
    """The slow tier's kill test hung 1 run in 3: a worker killed mid-result left half a
    message in the pipe and CPython's executor waited for the rest for ever. The wait for a
    result sees the death, and the process exits (its exit joins the executor's thread)."""
    script = tmp_path / "broken_pool.py"
    script.write_text(BROKEN_POOL)
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{tests.parent}{os.pathsep}{tests}"}
    child = subprocess.run([sys.executable, str(script)], capture_output=True, env=env, timeout=120)
    assert (child.returncode, child.stdout) == (0, b"broken\n"), child.stderr.decode()


def test_a_rerun_with_another_option_is_refused_naming_the_option(corpus, tmp_path):
    """Issue 40: the refusal said only `OUT exists`, not which option differed."""
    src, _ = corpus
    out = tmp_path / "out"
    assert tokenize(str(src / "a.jsonl"), str(out)).exit_code == 0
    other = tokenize(str(src / "a.jsonl"), str(out), "--val-fraction", "0.25")
    assert other.exit_code == 2
    assert f"{out} exists and was made with val_fraction = 0.0, not 0.25" in other.stderr

"""``data tokenize`` in bounded memory whatever the input, and every bad input one line (issue 35).

The cases the issue measured on main: a 1 MB newline-free gzip member peaking at 2,762 MB RSS,
a lone-surrogate escape and a 100,000-deep line ending in ``UnicodeEncodeError`` /
``RecursionError`` (exit 1, no file named), ``--workers -3`` said "the sources hold no
documents", a full disk said ``OSError: [Errno 28]`` naming no path, a dictionary-encoded
Parquet text column refused as "not text", ``hf://datasets/../x`` answered "(no answer)", and
the documented rerun after fixing a damaged ``.gz`` refused with "remove out.partial".
"""

from __future__ import annotations

import gzip
import json
import os
import random
import resource
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from ingest_support import documents, expected_tokens, train_bpe, write_jsonl
from proc_support import quiet_env
from typer.testing import CliRunner

from speedtronic.cli.app import app
from speedtronic.data.ingest import formats, pipeline
from speedtronic.data.ingest.pipeline import tokenize_corpus
from speedtronic.data.ingest.plan import Request
from speedtronic.data.manifest import read_manifest
from speedtronic.errors import DataError

runner = CliRunner()


def tokenize(*args: str):
    workers = [] if "--workers" in args else ["--workers", "1"]
    return runner.invoke(app, ["data", "tokenize", *args, *workers])


def one_error(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("speedtronic:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def newline_free_gz(path: Path, megabytes: int) -> Path:
    """A gzip member of one JSON line that never ends: ~1000x smaller than what it holds."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"a" * (1 << 20)
    parts = [packer.compress(b'{"text": "')]
    parts += [packer.compress(block) for _ in range(megabytes)]
    path.write_bytes(b"".join(parts) + packer.flush())
    return path


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_newline_free_gzip_member_is_refused_at_the_limit_naming_the_file(tmp_path, workers):
    bomb = newline_free_gz(tmp_path / "bomb.jsonl.gz", 2)
    result = tokenize(str(bomb), str(tmp_path / "out"), "--max-document-bytes", "100000",
                      "--workers", workers)  # fmt: skip
    assert result.exit_code == 2
    line = one_error(result)
    assert f"{bomb}: the line at byte 0 of its decompressed text is longer than 100,000" in line
    assert "--max-document-bytes" in line


def test_a_long_line_is_refused_by_the_workers_and_by_the_cut_alike(tmp_path):
    long_doc = "x" * 5000
    source = write_jsonl(tmp_path / "a.jsonl", ["short", long_doc, "short again"])
    result = tokenize(str(source), str(tmp_path / "out"), "--max-document-bytes", "4000")
    assert result.exit_code == 2
    second = source.read_bytes().index(b"\n") + 1
    assert f"{source}: the line at byte {second} is longer than 4,000 bytes" in one_error(result)
    with pytest.raises(DataError, match="the line holding byte 100 is longer than 1,000"):
        formats.line_bounds(str(source), 100, 1000, str(source))  # never read past the limit
    ok = tokenize(str(source), str(tmp_path / "out2"), "--max-document-bytes", "6000")
    assert ok.exit_code == 0, ok.output


def test_a_parquet_value_over_the_limit_names_its_row(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["a", "b", "y" * 3000, "c"]}), path, row_group_size=2)
    result = tokenize(str(path), str(tmp_path / "out"), "--max-document-bytes", "2000")
    assert result.exit_code == 2
    assert f"{path}: row 2 of column 'text' is 3,000 bytes" in one_error(result)


def test_peak_memory_of_a_gzip_bomb_stays_far_below_what_it_expands_to(tmp_path):
    """256 MB of newline-free text behind 256 KB of gzip: main read it whole (2.7x its size)."""
    bomb = newline_free_gz(tmp_path / "bomb.jsonl.gz", 256)
    command = [sys.executable, "-m", "speedtronic", "data", "tokenize", str(bomb),
               str(tmp_path / "out"), "--workers", "1"]  # fmt: skip
    probe = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "print(r.stderr, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *command], capture_output=True, text=True, env=quiet_env()
    )
    code, peak_kib = (int(v) for v in done.stdout.split())
    assert code == 2 and "longer than 67,108,864 bytes" in done.stderr, done.stderr
    assert peak_kib * 1024 < 256 << 20  # the limit (64 MiB) and the interpreter, not the bomb


BAD = {
    "surrogate": (
        b'{"text": "ok"}\n{"text": "bad \\ud800 x"}\n',
        "line at byte 15 holds the escape \\ud800",
    ),  # fmt: skip
    "deep": (
        b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
        "line at byte 0 is not JSON a parser can read (nested too deep)",
    ),  # fmt: skip
}


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_a_lone_surrogate_or_a_too_deep_line_is_one_line_exit_2(tmp_path, case, workers):
    data, expected = BAD[case]
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    result = tokenize(str(path), str(tmp_path / "out"), "--workers", workers)
    assert result.exit_code == 2
    line = one_error(result)
    assert line.startswith(f"speedtronic: error: {path}: ") and expected in line


def test_a_surrogate_pair_escape_is_text():
    docs, _ = formats.json_lines(b'{"text": "smile \\ud83d\\ude00"}\n', 0, "text", "x")
    assert docs == ["smile \U0001f600"]


@pytest.mark.parametrize("value", ["-3", "0", "100000"])
def test_workers_out_of_range_is_named(tmp_path, value):
    source = write_jsonl(tmp_path / "a.jsonl", documents(30))
    result = tokenize(str(source), str(tmp_path / "out"), "--workers", value)
    assert result.exit_code == 2
    assert f"--workers: must be between 1 and {4 * (os.cpu_count() or 1)} (got {value})" in (
        one_error(result)
    )


def test_a_write_that_fails_names_the_file_and_a_rerun_continues(tmp_path):
    """A file-size limit (RLIMIT_FSIZE) fails writes as a full disk does, with the real OS."""
    docs = documents(3000)
    source = write_jsonl(tmp_path / "a.jsonl", docs)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "speedtronic", "data", "tokenize", str(source), str(out),
               "--workers", "1"]  # fmt: skip

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))

    failed = subprocess.run(
        command, capture_output=True, text=True, env=quiet_env(), preexec_fn=small_files
    )
    assert failed.returncode == 1, failed.stderr
    lines = [x for x in failed.stderr.splitlines() if x.startswith("speedtronic:")]
    assert len(lines) == 1 and "Traceback" not in failed.stderr
    assert f"{out}.partial/train_00000.bin: cannot write (File too large)" in lines[0]
    done = subprocess.run(command, capture_output=True, text=True, env=quiet_env())
    assert done.returncode == 0, done.stderr
    ids = np.fromfile(out / "train_00000.bin", dtype=np.uint16).tolist()
    assert ids == expected_tokens(docs, None, 3)


def test_a_full_disk_at_a_commit_names_the_file(tmp_path, monkeypatch):
    from speedtronic.data.ingest import writer

    source = write_jsonl(tmp_path / "a.jsonl", documents(10))

    def full(_fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer.os, "fsync", full)
    result = tokenize(str(source), str(tmp_path / "out"))
    assert result.exit_code == 1
    line = one_error(result)
    assert "out.partial/" in line and "cannot write (No space left on device)" in line


def test_a_dictionary_encoded_parquet_column_is_text(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    docs = ["red", "green", "red", "blue", "green", "red"]
    plain, coded = tmp_path / "plain.parquet", tmp_path / "coded.parquet"
    pq.write_table(pa.table({"text": docs}), plain)
    pq.write_table(pa.table({"text": pa.array(docs).dictionary_encode()}), coded)
    assert pa.types.is_dictionary(pq.ParquetFile(coded).schema_arrow.field("text").type)
    for path in (plain, coded):
        assert tokenize(str(path), str(tmp_path / f"{path.stem}.bin")).exit_code == 0
    assert (tmp_path / "coded.bin").read_bytes() == (tmp_path / "plain.bin").read_bytes()


@pytest.mark.parametrize(
    "source",
    ["hf://datasets/../x", "hf://datasets/a b/x", "hf://datasets/ok/na me", "hf://datasets/o/x--y"],
)
def test_a_hub_name_against_the_hubs_rule_is_one_line_without_a_request(tmp_path, source):
    env = {"HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens: a request would fail
    result = runner.invoke(app, ["data", "tokenize", source, str(tmp_path / "out")], env=env)
    assert result.exit_code == 2
    line = one_error(result)
    assert "is not a Hub repo id: OWNER and NAME are 1-96 letters" in line and source in line


def test_a_damaged_gz_fixed_after_a_commit_is_read_again_from_its_start(tmp_path, monkeypatch):
    """docs/data.md: "fix the file and rerun". The damage lies past a commit inside the file."""
    monkeypatch.setattr(pipeline, "COMMIT_S", 0.0)
    monkeypatch.setattr(formats, "UNIT_BYTES", 4096)
    docs = [f"document {i} " + "word " * (i % 50) for i in range(3000)]
    good = tmp_path / "good.jsonl.gz"
    with gzip.open(good, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    source = tmp_path / "a.jsonl.gz"
    source.write_bytes(good.read_bytes()[: good.stat().st_size * 3 // 4])
    request = Request((str(source),), shard_tokens=20_000)
    with pytest.raises(DataError, match="damaged gzip data"):
        tokenize_corpus(request, tmp_path / "out", workers=1)
    journal = json.loads((tmp_path / "out.partial" / "progress.json").read_text())
    assert journal["next"][0] == 0 and journal["next"][1] > 0  # stopped inside the file
    source.write_bytes(good.read_bytes())
    report = tokenize_corpus(request, tmp_path / "out", workers=1)
    assert report["documents"] == 3000
    doc = read_manifest(tmp_path / "out", "out")
    ids = [np.fromfile(tmp_path / "out" / s["file"], np.uint16) for s in doc["parts"]["train"]]
    assert np.concatenate(ids).tolist() == expected_tokens(docs, None, 3)


def test_a_long_document_is_encoded_in_pieces_that_give_the_wholes_ids(tmp_path, monkeypatch):
    """tokenizers holds ~150 bytes a token while it encodes (16 MB: 2.35 GB): long documents go
    in pieces, cut where the byte-level pre-tokenizer splits anyway, "\\n\\n" and tabs included."""
    from tokenizers import Tokenizer

    from speedtronic.data.ingest import encode

    bpe = train_bpe(tmp_path / "tokenizer.json", vocab_size=400, corpus_bytes=200_000)
    rng = random.Random(1)
    words = "the cat sat on a mat, while two dogs ran past the old red barn. It's 42!".split()
    gaps = [" ", " ", " ", "\n", "\n\n", "  ", " \n", "\t"]
    text = "".join(rng.choice(words) + rng.choice(gaps) for _ in range(20_000))
    whole = Tokenizer.from_file(str(bpe)).encode(text, add_special_tokens=False).ids
    monkeypatch.setattr(encode, "PIECE_CHARS", 2000)
    assert len(encode.pieces(text, 2000)) > 20
    encoder = encode.Encoder(str(bpe), encode.Separator((0,), (), ("s",), "r"), 0.0, "uint16")
    assert encoder._pieces
    got = encoder.documents([text, "a short one"])
    assert got.train[1 : 1 + len(whole)].tolist() == whole
    assert got.lengths.tolist()[0] == len(whole) + 1

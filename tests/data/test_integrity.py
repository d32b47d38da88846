"""A token folder is held to its manifest before a run's first step (issue 35): a shard
zero-filled at its size, a shard swapped for a link to zeros, a manifest sha256 set to zeros and a
``tokenizer.json`` replaced by another of the same size are each one line naming the file (exit
2), and nothing is written; the verdict is cached per file, so a second start hashes nothing.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from ingest_support import documents, train_bpe, write_jsonl
from typer.testing import CliRunner

from speedtronic.cli.app import app
from speedtronic.data import integrity
from speedtronic.data.ingest.pipeline import tokenize_corpus
from speedtronic.data.ingest.plan import Request
from speedtronic.data.manifest import read_manifest, tokenizer_of
from speedtronic.errors import DataError

runner = CliRunner()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A BPE-tokenized folder (train and val parts) and a second BPE file of the same size."""
    root = tmp_path_factory.mktemp("integrity")
    bpe = train_bpe(root / "bpe.json", vocab_size=300, corpus_bytes=1 << 16)
    other = train_bpe(root / "other.json", vocab_size=300, corpus_bytes=1 << 15)
    data, swap = bpe.read_bytes(), other.read_bytes()
    assert len(swap) <= len(data) and swap != data
    (root / "swap.json").write_bytes(swap[:-1] + b" " * (len(data) - len(swap)) + swap[-1:])
    write_jsonl(root / "d.jsonl", documents(120))
    tokenize_corpus(Request((str(root / "d.jsonl"),), str(bpe), val_fraction=0.1), root / "t", 1)
    return root


def copy(made, tmp_path):
    folder = tmp_path / "tokens"
    shutil.copytree(made / "t", folder)
    (folder / integrity.CACHE_FILE).unlink(missing_ok=True)
    return folder


def train_shard(folder):
    return json.loads((folder / "manifest.json").read_text())["parts"]["train"][0]["file"]


def train(tiny, folder, tmp_path):
    tiny["model"]["vocab_size"] = 320
    tiny["data"].update(token_path=str(folder), eval_path=str(folder), eval_every=3)
    (tmp_path / "c.yaml").write_text(json.dumps(tiny))
    return runner.invoke(app, ["train", "-c", str(tmp_path / "c.yaml")])


def refused(result, *words):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("speedtronic: error: data.token_path: "), result.stderr
    assert all(word in lines[0] for word in words), lines[0]
    assert "Traceback" not in result.output


def test_a_zero_filled_shard_is_refused_before_step_one(made, tmp_path, tiny):
    folder = copy(made, tmp_path)
    shard = folder / train_shard(folder)
    shard.write_bytes(bytes(shard.stat().st_size))
    result = train(tiny, folder, tmp_path)
    refused(result, str(shard), "sha256", "tokenize again")
    assert not (tmp_path / "run").exists()  # refused before the output dir was touched


def test_a_shard_swapped_for_a_link_to_zeros_is_verified_like_any_other(made, tmp_path, tiny):
    folder = copy(made, tmp_path)
    shard = folder / train_shard(folder)
    zeros = tmp_path / "zeros.bin"
    zeros.write_bytes(bytes(shard.stat().st_size))
    shard.unlink()
    shard.symlink_to(zeros)
    refused(train(tiny, folder, tmp_path), str(shard), f"a link to {zeros}")
    good = tmp_path / "elsewhere.bin"  # a link to the right bytes trains
    shutil.copyfile(made / "t" / shard.name, good)
    shard.unlink()
    shard.symlink_to(good)
    assert train(tiny, folder, tmp_path).exit_code == 0


def test_a_manifest_sha256_set_to_zeros_is_refused(made, tmp_path, tiny):
    folder = copy(made, tmp_path)
    doc = json.loads((folder / "manifest.json").read_text())
    doc["parts"]["val"][0]["sha256"] = "0" * 64
    (folder / "manifest.json").write_text(json.dumps(doc))
    refused(train(tiny, folder, tmp_path), doc["parts"]["val"][0]["file"], "promises 0000")


def test_a_swapped_tokenizer_of_the_same_size_is_refused_for_training_and_decoding(
    made, tmp_path, tiny
):
    folder = copy(made, tmp_path)
    shutil.copyfile(made / "swap.json", folder / "tokenizer.json")
    assert (folder / "tokenizer.json").stat().st_size == (made / "bpe.json").stat().st_size
    refused(train(tiny, folder, tmp_path), str(folder / "tokenizer.json"), "not the tokenizer")
    with pytest.raises(DataError, match="is not the tokenizer .* records"):
        tokenizer_of(folder, read_manifest(folder, "data.token_path"))


def test_the_verdict_is_cached_so_a_second_start_hashes_nothing(made, tmp_path):
    folder = copy(made, tmp_path)
    doc = read_manifest(folder, "data.token_path")
    first = integrity.verify_folder(folder, doc, "data.token_path")
    assert first.hashed_files == first.files == 3 and first.cache == str(
        folder / integrity.CACHE_FILE
    )
    again = integrity.verify_folder(folder, doc, "data.token_path")
    assert again.hashed_files == 0 and again.bytes == first.bytes
    shard = folder / train_shard(folder)
    before = shard.stat()
    shard.write_bytes(bytes(before.st_size))  # same size, and the mtime put back
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(DataError, match=f"shard {shard} has sha256"):
        integrity.verify_folder(folder, doc, "data.token_path")


def test_a_folder_that_cannot_be_written_keeps_its_verdict_in_the_user_cache(
    made, tmp_path, monkeypatch
):
    folder = copy(made, tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    real = integrity._cache_paths
    unwritable = tmp_path / "read-only" / "verified.json"  # its parent cannot be made

    (tmp_path / "read-only").write_text("a file, so nothing can be created under it")
    monkeypatch.setattr(integrity, "_cache_paths", lambda f: [unwritable, *real(f)[1:]])
    doc = read_manifest(folder, "data.token_path")
    first = integrity.verify_folder(folder, doc, "data.token_path")
    assert first.cache.startswith(str(tmp_path / "cache")) and first.hashed_files == 3
    assert integrity.verify_folder(folder, doc, "data.token_path").hashed_files == 0


def test_hashing_falls_back_to_the_calling_thread(made, tmp_path, monkeypatch):
    def no_thread(*args, **kwargs):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(integrity.ThreadPoolExecutor, "submit", no_thread)
    paths = sorted((made / "t").glob("*.bin"))
    found = integrity.hash_files(paths, threads=4)
    assert found == {p: integrity.sha256_file(p) for p in paths}
    doc = json.loads((made / "t" / "manifest.json").read_text())
    assert found[made / "t" / train_shard(made / "t")] == doc["parts"]["train"][0]["sha256"]


def test_validate_accepts_a_token_folder_and_reports_its_manifest(made, tmp_path, tiny):
    """Issue 35: validate said 'data.token_path: corpus is a directory, not a file' (exit 2)."""
    folder = copy(made, tmp_path)
    tiny["model"]["vocab_size"] = 320
    tiny["data"].update(token_path=str(folder))
    (tmp_path / "c.yaml").write_text(json.dumps(tiny))
    text = runner.invoke(app, ["validate", "-c", str(tmp_path / "c.yaml")])
    assert text.exit_code == 0, text.output
    doc = json.loads((folder / "manifest.json").read_text())
    tokens = doc["counts"]["tokens"]
    assert f"# data: tokens {folder} (folder: {tokens:,} uint16 tokens in 2 shard(s)" in text.stdout
    assert '"verified": true' in text.stdout
    out = runner.invoke(app, ["validate", "-c", str(tmp_path / "c.yaml"), "--format", "json"])
    found = json.loads(out.stdout)["facts"]["token_folders"]["data.token_path"]
    assert found["tokens"] == tokens and found["shards"] == 2 and found["verified"] is True
    assert found["tokenizer"]["vocab_size"] == 300 and found["hashed_bytes"] == 0  # cached
    shard = folder / train_shard(folder)
    shard.write_bytes(bytes(shard.stat().st_size))
    bad = runner.invoke(app, ["validate", "-c", str(tmp_path / "c.yaml")])
    refused(bad, str(shard), "sha256")


def test_train_names_the_folders_tokens_where_the_size_should_be(made, tmp_path, tiny):
    """Issue 35: train's first line said '(a directory, not a file)'."""
    folder = copy(made, tmp_path)
    result = train(tiny, folder, tmp_path)
    assert result.exit_code == 0, result.output
    first = result.stderr.splitlines()[0]
    assert "a directory, not a file" not in first
    tokens = json.loads((folder / "manifest.json").read_text())["counts"]["tokens"]
    assert f"data: tokens {folder} (folder: {tokens:,} uint16 tokens in 2 shard(s)" in first


def test_a_shard_that_cannot_be_read_is_one_line_naming_it(made, tmp_path, monkeypatch):
    folder = copy(made, tmp_path)
    shard = folder / train_shard(folder)

    def unreadable(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(integrity, "sha256_file", unreadable)
    with pytest.raises(DataError, match=f"data.token_path: {shard} cannot be read"):
        integrity.verify_folder(folder, read_manifest(folder, "data.token_path"), "data.token_path")

"""``hf://datasets/...`` sources and ``hf://`` tokenizers against the Hub emulator (issue 28).

The emulator serves dataset repos as the Hub does (``/api/datasets/...`` listings and info,
``/datasets/.../resolve/...`` with a 302 to the storage origin for the LFS ``.parquet`` files).
Faults on both origins (429 with its reset, 5xx, dropped answers, bodies cut short) are retried
by the Hub client's policy, downloads resume with ``Range``, and the output is byte for byte the
tokenize of the same files read locally. Backoff sleeps go to a list: nothing waits for real.
"""

# The environment must be set before huggingface_hub is imported, hence:
# ruff: noqa: E402
from __future__ import annotations

import json
import os
import tempfile

os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="hf_home_"))
os.environ.pop("HF_HUB_OFFLINE", None)

import hashlib
import shutil

import pytest
from ingest_support import documents, parquet_bytes, train_bpe
from typer.testing import CliRunner

from speedtronic.cli.app import app
from speedtronic.data.ingest import hub_source
from speedtronic.data.manifest import read_manifest
from speedtronic.hub.datasets import RepoFiles
from speedtronic.hub.files import HubFile

pytest.importorskip("pyarrow")
pytestmark = [pytest.mark.hub, pytest.mark.usefixtures("library_sleeps")]
runner = CliRunner()
DATASET = "datasets/alice/fineweb"  # the emulator's key for the dataset repo alice/fineweb
SOURCE = "hf://datasets/alice/fineweb/sample/10BT/*.parquet"


@pytest.fixture
def slept(monkeypatch, hub_emulator):
    waits: list[float] = []
    monkeypatch.setattr(hub_source, "CLIENT_OPTIONS", {"sleep": waits.append, "max_attempts": 6})
    monkeypatch.setattr(hub_source, "_BUDGET", [])
    monkeypatch.setenv("HF_ENDPOINT", hub_emulator.url)
    return waits


@pytest.fixture(scope="module")
def shards():
    docs = documents(90, seed=3)
    return {
        "sample/10BT/000_00000.parquet": parquet_bytes(docs[:40], row_group_size=8),
        "sample/10BT/001_00000.parquet": parquet_bytes(docs[40:], row_group_size=8),
        "sample/100BT/000_00000.parquet": parquet_bytes(docs[:5]),
        "README.md": b"# FineWeb, emulated\n",
    }


@pytest.fixture
def dataset(hub_emulator, shards, tmp_path):
    hub_emulator.create_repo(DATASET, files=shards)
    local = tmp_path / "local"
    local.mkdir()
    for name in ("000_00000.parquet", "001_00000.parquet"):
        (local / name).write_bytes(shards[f"sample/10BT/{name}"])
    return local


def tokenize(*args: str):
    return runner.invoke(app, ["data", "tokenize", *args, "--workers", "1"])


def folder_bytes(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix == ".bin"}


def test_a_hub_dataset_through_every_fault_equals_the_local_files(
    hub_emulator, dataset, slept, tmp_path
):
    emu = hub_emulator
    emu.faults.add(429, path_re="/api/datasets/.*/tree/", headers={"RateLimit": '"api";r=0;t=2'})
    emu.faults.add(503, path_re="/datasets/alice/fineweb/resolve/", times=2)
    emu.faults.add("timeout", path_re="/api/datasets/alice/fineweb/revision/", delay_s=0.0)
    emu.storage.faults.add("truncate", times=2)
    emu.storage.faults.add(500, times=1)
    result = tokenize(SOURCE, str(tmp_path / "hub"), "--format", "json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["files"] == 2 and report["documents"] == 90
    assert report["hub_calls"] >= 6 and report["hub_storage_requests"] >= 5
    assert emu.faults.pending() == 0 and emu.storage.faults.pending() == 0
    assert any(method == "GET" and status == 206 for method, _, status in emu.storage.requests)
    assert any(2.0 <= wait <= 3.0 for wait in slept)  # the 429's reset, plus jitter
    assert tokenize(str(dataset), str(tmp_path / "local_out")).exit_code == 0
    assert folder_bytes(tmp_path / "hub") == folder_bytes(tmp_path / "local_out")
    manifest = read_manifest(tmp_path / "hub", "x")
    sha = emu.repo(DATASET).head.sha
    files = ("000_00000.parquet", "001_00000.parquet")
    names = [s["name"] for s in manifest["sources"]]
    assert names == [f"hf://datasets/alice/fineweb@{sha}/sample/10BT/{n}" for n in files]
    for source, name in zip(manifest["sources"], files, strict=True):
        assert source["sha256"] == hashlib.sha256((dataset / name).read_bytes()).hexdigest()
    assert not (tmp_path / "hub.partial").exists()  # downloads went with it


def test_a_resumed_hub_tokenize_reads_the_snapshot_it_started_on(
    hub_emulator, dataset, shards, slept, tmp_path
):
    from speedtronic.data.ingest.pipeline import tokenize_corpus
    from speedtronic.data.ingest.plan import Request

    request = Request((SOURCE,), shard_tokens=500)
    calls = []

    def stop(_):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokenize_corpus(request, tmp_path / "out", workers=1, on_progress=stop)
    downloads = tmp_path / "out.partial" / "downloads"
    assert list(downloads.rglob("*.parquet"))  # kept for the rerun
    shutil.rmtree(downloads)  # so the rerun downloads again, from the commit it pinned
    changed = parquet_bytes(documents(10, seed=9))
    hub_emulator.push(DATASET, {"sample/10BT/001_00000.parquet": changed})  # main moves on
    tokenize_corpus(request, tmp_path / "out", workers=1)
    tokenize_corpus(Request((str(dataset),), shard_tokens=500), tmp_path / "ref", workers=1)
    assert folder_bytes(tmp_path / "out") == folder_bytes(tmp_path / "ref")


def test_a_cache_dir_keeps_the_downloads_and_saves_the_second_download(
    hub_emulator, dataset, slept, tmp_path
):
    cache = tmp_path / "cache"
    assert tokenize(SOURCE, str(tmp_path / "a"), "--cache-dir", str(cache)).exit_code == 0
    assert len(list(cache.rglob("*.parquet"))) == 2
    before = hub_emulator.storage.count("GET")
    assert tokenize(SOURCE, str(tmp_path / "b"), "--cache-dir", str(cache)).exit_code == 0
    assert hub_emulator.storage.count("GET") == before  # verified against the listing, not fetched
    assert folder_bytes(tmp_path / "a") == folder_bytes(tmp_path / "b")


def test_a_file_or_a_folder_of_the_repo_can_be_named_without_a_glob(
    hub_emulator, dataset, slept, tmp_path
):
    one = "hf://datasets/alice/fineweb@main/sample/10BT/001_00000.parquet"
    assert tokenize(one, str(tmp_path / "one"), "--format", "json").exit_code == 0
    assert read_manifest(tmp_path / "one", "x")["counts"]["documents"] == 50
    folder = tokenize("hf://datasets/alice/fineweb/sample/10BT", str(tmp_path / "folder"))
    assert folder.exit_code == 0, folder.stderr
    assert folder_bytes(tmp_path / "folder") == folder_bytes(_local(dataset, tmp_path))


def _local(dataset, tmp_path):
    assert tokenize(str(dataset), str(tmp_path / "reference")).exit_code == 0
    return tmp_path / "reference"


def test_hub_mistakes_are_one_line(hub_emulator, dataset, slept, tmp_path):
    nothing = tokenize("hf://datasets/alice/fineweb/sample/1BT/*.parquet", str(tmp_path / "o"))
    assert nothing.exit_code == 2
    assert "nothing in hf://datasets/alice/fineweb@" in nothing.stderr
    assert "matches 'sample/1BT/*.parquet'" in nothing.stderr
    missing = tokenize("hf://datasets/alice/nope", str(tmp_path / "o"))
    assert missing.exit_code == 1
    assert "cannot find repo dataset alice/nope (" in missing.stderr
    assert "hint: check the repo id on the Hub" in missing.stderr
    model = tokenize("hf://alice/fineweb/x.parquet", str(tmp_path / "o"))
    assert model.exit_code == 2 and "hf://datasets/OWNER/NAME" in model.stderr
    assert not list(tmp_path.glob("o*"))


def test_a_private_dataset_needs_a_token_and_the_token_stays_out_of_messages(
    hub_emulator, shards, slept, monkeypatch, tmp_path
):
    hub_emulator.create_repo("datasets/alice/secret", private=True, files=shards)
    source = "hf://datasets/alice/secret/sample/10BT"
    anonymous = tokenize(source, str(tmp_path / "a"))
    assert anonymous.exit_code == 1 and "cannot find repo dataset alice/secret" in anonymous.stderr
    monkeypatch.setenv("HF_TOKEN", hub_emulator.token)
    with_token = tokenize(source, str(tmp_path / "b"))
    assert with_token.exit_code == 0, with_token.stderr
    hub_emulator.faults.add(403, path_re="resolve")
    refused = tokenize(source, str(tmp_path / "c"))
    assert refused.exit_code == 1 and hub_emulator.token not in refused.stderr


def test_a_hub_tokenizer_is_fetched_through_the_client_and_recorded(
    hub_emulator, dataset, slept, tmp_path
):
    bpe = train_bpe(tmp_path / "tokenizer.json", vocab_size=500)
    hub_emulator.create_repo("alice/gpt2", files={"tokenizer.json": bpe.read_bytes()})
    hub_emulator.faults.add(502, path_re="/alice/gpt2/resolve/")
    spec = "hf://alice/gpt2/tokenizer.json"
    result = tokenize(SOURCE, str(tmp_path / "out"), "--tokenizer", spec)
    assert result.exit_code == 0, result.stderr
    manifest = read_manifest(tmp_path / "out", "x")
    sha = hub_emulator.repo("alice/gpt2").head.sha
    assert manifest["tokenizer"]["source"] == f"hf://alice/gpt2@{sha}/tokenizer.json"
    assert manifest["vocab_size"] == 500
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == bpe.read_bytes()
    local = tokenize(str(dataset), str(tmp_path / "ref"), "--tokenizer", str(bpe))
    assert local.exit_code == 0
    assert folder_bytes(tmp_path / "out") == folder_bytes(tmp_path / "ref")
    from speedtronic.data.tokenizer import load_tokenizer

    loaded = load_tokenizer(spec)  # data.tokenizer: hf://... for text sources, cached
    assert loaded.vocab_size == 500 and loaded.path.read_bytes() == bpe.read_bytes()


def test_downloads_resume_with_range_and_a_wrong_body_is_fetched_again(
    hub_emulator, shards, tmp_path
):
    hub_emulator.create_repo(DATASET, files=shards)
    waits: list[float] = []
    client = RepoFiles("alice/fineweb", endpoint=hub_emulator.url, sleep=waits.append)
    sha = client.resolve("main")
    listed = {f.path: f for f in client.list_files(sha, "sample")}
    assert set(listed) == {p for p in shards if p.startswith("sample/")}
    target = listed["sample/10BT/000_00000.parquet"]
    hub_emulator.storage.faults.add("truncate", times=3)
    dest = tmp_path / "x.parquet"
    digest = client.download(target, sha, dest)
    assert dest.read_bytes() == shards[target.path]
    assert digest == target.sha256 and len(waits) == 3
    statuses = [s for m, _, s in hub_emulator.storage.requests if m == "GET"]
    assert statuses == [200, 206, 206, 206]
    import threading

    from speedtronic.hub.datasets import Cancelled

    stopped = threading.Event()
    stopped.set()  # what Downloads.close does when --max-tokens is reached mid-download
    with pytest.raises(Cancelled):
        client.download(target, sha, tmp_path / "z.parquet", stopped)
    assert (tmp_path / "z.parquet.incomplete").exists() and not (tmp_path / "z.parquet").exists()
    assert client.download(target, sha, tmp_path / "z.parquet") == target.sha256
    liar = HubFile(target.path, target.size, target.oid, "0" * 64, None)
    with pytest.raises(Exception, match="do not match the listing"):
        client.download(liar, sha, tmp_path / "y.parquet")
    assert not (tmp_path / "y.parquet").exists()
    assert not (tmp_path / "y.parquet.incomplete").exists()


def test_the_library_reads_the_emulated_dataset_repo_as_it_reads_the_hub(hub_emulator, shards):
    from huggingface_hub import HfApi, hf_hub_download

    hub_emulator.create_repo(DATASET, files=shards)
    api = HfApi(endpoint=hub_emulator.url)
    assert api.dataset_info("alice/fineweb").id == "alice/fineweb"
    files = api.list_repo_files("alice/fineweb", repo_type="dataset")
    assert set(files) == {".gitattributes", *shards}
    tree = {e.path: e for e in api.list_repo_tree("alice/fineweb", "sample", recursive=True,
                                                   repo_type="dataset")}  # fmt: skip
    parquet = tree["sample/10BT/000_00000.parquet"]
    assert (
        parquet.lfs is not None
        and parquet.lfs.sha256 == hashlib.sha256(shards[parquet.path]).hexdigest()
    )
    path = hf_hub_download(
        "alice/fineweb", parquet.path, repo_type="dataset", endpoint=hub_emulator.url,
        cache_dir=os.environ["HF_HOME"],
    )  # fmt: skip
    assert open(path, "rb").read() == shards[parquet.path]
    redirects = [r for r in hub_emulator.requests if r[2] == 302]
    assert redirects and "/datasets/alice/fineweb/resolve/" in redirects[0][1]

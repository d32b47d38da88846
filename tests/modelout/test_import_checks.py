"""What ``speedtronic import`` refuses (issue 46): one validation of the source before anything is
written. config.json's values are held to the run config's rules and named by config.json's keys,
the counts are checked against the safetensors headers before a model is built, every tensor is
finite, whole-file reads are bounded, and OUT is owned as export owns it (a link is its target; a
killed import's temporary copy is removed by the next one).

The sources are tiny reference models written in this process under Llama's names (the export
mapping), so the tests need neither transformers nor a download.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch
from modelout_support import assert_one_line_error, invoke
from safetensors.torch import load_file, save_file

from speedtronic.model import ReferenceConfig, ReferenceTransformer
from speedtronic.modelout import llama
from speedtronic.modelout.tokenizer_files import byte_tokenizer_json

SIZES = dict(vocab_size=300, seq_len=64, n_layer=2, n_head=4, n_kv_head=2, d_model=32)


def llama_dir(tmp_path, name="src", tokenizer=True, vocab_size=300, **changes):
    """A tiny Llama directory (config.json, model.safetensors, a byte tokenizer.json) with
    ``changes`` applied to config.json."""
    torch.manual_seed(0)
    config = ReferenceConfig(**{**SIZES, "vocab_size": vocab_size}, mlp_hidden=48)
    folder = tmp_path / name
    folder.mkdir()
    state = llama.llama_state(ReferenceTransformer(config), "fp32")
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    doc = {**llama.llama_config(config, "fp32"), **changes}
    (folder / "config.json").write_text(json.dumps(doc))  # Infinity, as json.dumps writes it
    if tokenizer:
        (folder / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json()))
    return folder


def refused_before_writing(result, tmp_path, *needles, out="run"):
    line = assert_one_line_error(result, *needles)
    assert not (tmp_path / out).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    return line


@pytest.mark.parametrize(
    "key, poison",
    [("model.layers.0.self_attn.q_proj.weight", float("nan")),
     ("model.embed_tokens.weight", float("inf"))],
    ids=["nan-q-proj", "inf-embedding"],
)  # fmt: skip
def test_a_non_finite_weight_is_refused_naming_the_tensor_and_the_file(key, poison, tmp_path):
    src = llama_dir(tmp_path)
    state = load_file(str(src / "model.safetensors"))
    state[key][1, 2] = poison
    save_file(state, str(src / "model.safetensors"), metadata={"format": "pt"})
    result = invoke("import", src, tmp_path / "run")
    refused_before_writing(result, tmp_path, key, "model.safetensors", "not finite")


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"rope_theta": float("inf")}, "config.json: rope_theta: must be finite (got inf)"),
        ({"rms_norm_eps": float("inf")}, "config.json: rms_norm_eps: must be finite (got inf)"),
        ({"rope_scaling": {**llama.llama3_scaling((8.0, 1.0, 4.0, 32)), "factor": float("inf")}},
         "config.json: rope_scaling.factor: must be finite (got inf)"),
        ({"max_position_embeddings": 2**21},
         "config.json: max_position_embeddings: must be in [1, 2**20] (got 2097152)"),
        ({"tie_word_embeddings": "false"}, "config.json: tie_word_embeddings: must be true or"),
        ({"num_key_value_heads": 3},
         "config.json: num_key_value_heads: must divide num_attention_heads=4 (got 3)"),
        ({"head_dim": 15}, "config.json: head_dim: must be even"),
        ({"rope_scaling": "llama3"}, "config.json: rope_scaling: must be a mapping"),
        ({"rope_scaling": {"type": "llama3"}}, "config.json: rope_scaling.factor: must be"),
    ],
    ids=["rope-theta-inf", "eps-inf", "llama3-factor-inf", "context-too-long", "bool-string",
         "kv-heads", "odd-head-dim", "rope-scaling-string", "llama3-no-factor"],
)  # fmt: skip
def test_config_values_are_held_to_the_run_configs_rules_in_config_json_words(
    changes, needle, tmp_path
):
    result = invoke("import", llama_dir(tmp_path, **changes), tmp_path / "run")
    refused_before_writing(result, tmp_path, needle)


def test_a_tokenizer_larger_than_the_vocabulary_is_refused_naming_both_sizes(tmp_path):
    src = llama_dir(tmp_path, vocab_size=200)  # the byte tokenizer has 256 ids
    result = invoke("import", src, tmp_path / "run")
    refused_before_writing(result, tmp_path, "tokenizer.json", "256", "vocab_size", "200")


def test_the_layer_count_is_checked_against_the_headers_before_a_model_is_built(
    tmp_path, monkeypatch
):
    import speedtronic.model

    built = speedtronic.model.ReferenceTransformer

    def bounded(config):  # the meta model of 10M layers took minutes and gigabytes
        assert config.n_layer < 1000, "a model was built before the counts were checked"
        return built(config)

    monkeypatch.setattr(speedtronic.model, "ReferenceTransformer", bounded)
    src = llama_dir(tmp_path, num_hidden_layers=10_000_000)
    result = invoke("import", src, tmp_path / "run")
    refused_before_writing(result, tmp_path, "num_hidden_layers: 10000000", "2 layers")


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_a_file_read_whole_is_bounded(name, tmp_path):
    src = llama_dir(tmp_path)
    (src / name).unlink()
    (src / name).symlink_to("/dev/zero")
    started = time.monotonic()
    result = invoke("import", src, tmp_path / "run")
    refused_before_writing(result, tmp_path, name, "regular file")
    assert time.monotonic() - started < 30
    (src / name).unlink()
    with open(src / name, "wb") as f:  # a sparse file past the limit, never read
        f.truncate(65 << 20)
    result = invoke("import", src, tmp_path / "run")
    refused_before_writing(result, tmp_path, name, "must be at most")


def test_an_out_that_is_a_link_is_written_through(tmp_path):
    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    result = invoke("import", llama_dir(tmp_path), tmp_path / "link")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "link").is_symlink()
    assert (tmp_path / "target" / "checkpoints").is_dir()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


KILLED = """
import os, signal, sys
from speedtronic.modelout.importer import import_model
def die(run_dir, source):  # kill -9 once everything is written, before it is moved into place
    os.kill(os.getpid(), signal.SIGKILL)
import_model(sys.argv[1], sys.argv[2], verify=die)
"""


def test_a_killed_imports_temporary_copy_is_removed_by_the_next_import(tmp_path):
    src = llama_dir(tmp_path)
    killed = subprocess.run([sys.executable, "-c", KILLED, src, tmp_path / "run"], timeout=300)
    assert killed.returncode == -9
    stale = [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-import-run-")]
    assert len(stale) == 1 and stale[0].name != f".tmp-import-run-{os.getpid()}"
    foreign = tmp_path / ".tmp-import-run-999999999"  # no such pid, but no import's mark either
    foreign.mkdir()
    result = invoke("import", src, tmp_path / "run")
    assert result.exit_code == 0, result.stderr
    assert not stale[0].exists() and foreign.is_dir()


def test_a_stale_copy_whose_mark_was_torn_or_is_huge_is_removed(tmp_path):
    """A kill while the writer's mark was written leaves it empty; a huge one is read with a
    bound (issue 53, item 5: before, both were taken as held forever, the huge one read whole)."""
    from speedtronic.modelout.importer import WRITER_MARK, _remove_stale

    hour_ago = time.time() - 3600
    copies = {pid: tmp_path / f".tmp-import-run-{pid}" for pid in (11, 12, 13)}
    for copy in copies.values():
        copy.mkdir()
    with (copies[12] / WRITER_MARK).open("wb") as handle:  # sparse: no disk space used
        handle.truncate(3 << 30)
    (copies[11] / WRITER_MARK).write_bytes(b"")
    (copies[13] / WRITER_MARK).write_text(f"{os.getpid()} {socket.gethostname()}\n")  # held
    for copy in copies.values():
        os.utime(copy / WRITER_MARK, (hour_ago, hour_ago))
    _remove_stale(tmp_path / "run")
    assert [p for p, copy in copies.items() if copy.exists()] == [13]


@pytest.mark.hub
def test_a_pinned_hub_revision_in_the_cache_imports_offline(
    hub_emulator, tmp_path, monkeypatch, library_sleeps
):
    src = llama_dir(tmp_path)
    hub_emulator.create_repo("alice/tiny", files={p.name: p.read_bytes() for p in src.iterdir()})
    sha = hub_emulator.repo("alice/tiny").head.sha
    monkeypatch.setenv("HF_ENDPOINT", hub_emulator.url)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = invoke("import", f"hf://alice/tiny@{sha}", tmp_path / "run1")
    assert first.exit_code == 0, first.stderr
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    again = invoke("import", f"hf://alice/tiny@{sha}", tmp_path / "run2", "--format", "json")
    assert again.exit_code == 0, again.stderr
    assert json.loads(again.stdout)["source"] == f"hf://alice/tiny@{sha}"

"""``--init-from`` holds the data's tokenizer to the source's (issue 48): a token folder
tokenized as bytes or with another tokenizer of the same size trained silently, and the
checkpoints recorded the data's tokenizer. Refused in one line naming both (train and validate)
unless ``--allow-tokenizer-mismatch``; the start-up notice names the source's tokenizer."""

from __future__ import annotations

import hashlib
import json

import pytest
import yaml
from modelout_support import assert_one_line_error, invoke, latest, text_file, train_text, write_bpe

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A run trained with a BPE file, and its corpus tokenized three ways."""
    tmp = tmp_path_factory.mktemp("init-tokenizer")
    bpe = write_bpe(tmp)
    other = write_bpe(tmp_path_factory.mktemp("other"), template_bos=True)  # 300 ids too
    run = train_text(tmp, str(bpe))
    folders = {}
    for name, tokenizer in [("own", bpe), ("byte", "byte"), ("other", other)]:
        extra = ("--separator", "<bos>") if name == "own" else ()
        args = (text_file(tmp), tmp / name, "--tokenizer", tokenizer, "--workers", 1, *extra)
        assert invoke("data", "tokenize", *args).exit_code == 0
        folders[name] = tmp / name
    return run, folders, {n: hashlib.sha256(p.read_bytes()).hexdigest() for n, p in
                          [("own", bpe), ("other", other)]}  # fmt: skip


def config(tmp_path, folder) -> str:
    data = {"token_path": str(folder), "seq_len": 16, "micro_batch_size": 4, "target_batch_size": 4}
    path = tmp_path / "mine.yaml"
    raw = {"run": {"device": "cpu", "max_steps": 1, "output_dir": str(tmp_path / "out")}}
    path.write_text(yaml.safe_dump({**raw, "data": data}))
    return str(path)


@pytest.mark.parametrize("data", ["byte", "other"])
@pytest.mark.parametrize("command", ["train", "validate"])
def test_data_of_another_tokenizer_is_refused_naming_both(made, tmp_path, data, command):
    run, folders, sha = made
    result = invoke(command, "-c", config(tmp_path, folders[data]), "--init-from", run)
    theirs = "bytes" if data == "byte" else sha["other"][:12]
    line = assert_one_line_error(result, f"data.token_path {folders[data]}", theirs, str(run))
    assert sha["own"][:12] in line and "--allow-tokenizer-mismatch" in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_switch_trains_on_it_recording_the_datas_tokenizer(made, tmp_path):
    run, folders, sha = made
    args = ("--init-from", run, "--allow-tokenizer-mismatch")
    result = invoke("train", "-c", config(tmp_path, folders["other"]), *args)
    assert result.exit_code == 0, result.stderr
    assert "training on it as --allow-tokenizer-mismatch says" in result.stderr
    meta = json.loads((latest(tmp_path / "out") / "meta.json").read_text())
    assert meta["tokenizer"]["sha256"] == sha["other"]


def test_the_models_own_tokenizer_trains_and_the_notice_names_it(made, tmp_path):
    run, folders, sha = made
    result = invoke("train", "-c", config(tmp_path, folders["own"]), "--init-from", run)
    assert result.exit_code == 0, result.stderr
    assert f"the model settings are {run}" in result.stderr, result.stderr
    assert f"its tokenizer is tokenizer.json sha256 {sha['own'][:12]}" in result.stderr


def test_the_models_own_tokenizer_saved_compactly_trains(made, tmp_path):
    """Issue 53 item 9: the same tokenizer saved compactly is the same tokenizer (the token
    files are byte-identical); the guard compared tokenizer.json's bytes and refused it."""
    from tokenizers import Tokenizer

    run, folders, sha = made
    compact = tmp_path / "compact.json"
    Tokenizer.from_file(str(run / "checkpoints" / latest(run).name / "tokenizer.json")).save(
        str(compact), pretty=False
    )
    assert hashlib.sha256(compact.read_bytes()).hexdigest() != sha["own"]
    args = (text_file(tmp_path), tmp_path / "tok", "--tokenizer", compact, "--workers", 1)
    assert invoke("data", "tokenize", *args, "--separator", "<bos>").exit_code == 0
    shards = sorted(p.name for p in folders["own"].glob("*.bin"))
    assert shards and shards == sorted(p.name for p in (tmp_path / "tok").glob("*.bin"))
    for name in shards:
        assert (tmp_path / "tok" / name).read_bytes() == (folders["own"] / name).read_bytes()
    result = invoke("train", "-c", config(tmp_path, tmp_path / "tok"), "--init-from", run)
    assert result.exit_code == 0, result.stderr
    assert "is tokenized with" not in result.stderr


@pytest.mark.parametrize("command", ["train", "validate"])
def test_a_flat_token_file_says_its_tokenizer_cannot_be_checked(made, tmp_path, command):
    """Issue 55 item 6: a flat .bin names no tokenizer; training it from a model is allowed,
    with one line saying the tokenizer could not be checked."""
    import numpy as np

    run, _, sha = made
    flat = tmp_path / "other.bin"
    np.arange(2000, dtype=np.uint16).__mod__(300).astype(np.uint16).tofile(flat)
    result = invoke(command, "-c", config(tmp_path, flat), "--init-from", run)
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "cannot be checked" in line]
    assert len(lines) == 1, result.stderr
    assert str(flat) in lines[0] and sha["own"][:12] in lines[0]
